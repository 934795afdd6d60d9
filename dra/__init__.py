"""The DRA kubelet plugin: ResourceSlices, dynamic MIG on prepare, CDI specs, health as taints."""
