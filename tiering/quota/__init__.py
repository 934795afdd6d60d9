"""Team quotas on Kueue: the quota policy, the tiers as ResourceFlavors, what the healthy
capacity backs, applying the rendered objects, and the service's flavor sync."""
