/*
 * A C program of our own that reads a node through libnvidia-ml.so.1 alone, as any NVML client
 * does. `probe json` prints what `nodeagent gpus --json` and `nodeagent mig show --json`
 * report, from NVML's C API; `probe events MS` waits up to MS milliseconds for an XID event
 * while another thread keeps calling NVML, and prints what it saw and how many calls the other
 * thread made meanwhile.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        nvmlReturn_t rc_ = (call);                                                       \
        if (rc_ != NVML_SUCCESS) {                                                       \
            fprintf(stderr, "%s: %d %s\n", #call, rc_, nvmlErrorString(rc_));            \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static void json_gpus(void) {
    unsigned int count;
    char driver[96], name[96], uuid[96], serial[96], vbios[96];
    int cuda;
    CHECK(nvmlSystemGetDriverVersion(driver, sizeof driver));
    CHECK(nvmlSystemGetCudaDriverVersion_v2(&cuda));
    CHECK(nvmlDeviceGetCount_v2(&count));
    printf("{\"gpus\": [");
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        nvmlPciInfo_t pci;
        nvmlMemory_t mem;
        unsigned int numa = 0, index, current = 0, pending = 0;
        int major, minor;
        CHECK(nvmlDeviceGetHandleByIndex_v2(i, &dev));
        CHECK(nvmlDeviceGetIndex(dev, &index));
        CHECK(nvmlDeviceGetName(dev, name, sizeof name));
        CHECK(nvmlDeviceGetUUID(dev, uuid, sizeof uuid));
        CHECK(nvmlDeviceGetSerial(dev, serial, sizeof serial));
        CHECK(nvmlDeviceGetVbiosVersion(dev, vbios, sizeof vbios));
        CHECK(nvmlDeviceGetPciInfo_v3(dev, &pci));
        CHECK(nvmlDeviceGetMemoryInfo(dev, &mem));
        CHECK(nvmlDeviceGetCudaComputeCapability(dev, &major, &minor));
        nvmlDeviceGetNumaNodeId(dev, &numa);
        nvmlReturn_t mig = nvmlDeviceGetMigMode(dev, &current, &pending);
        printf("%s{\"index\": %u, \"uuid\": \"%s\", \"name\": \"%s\", \"serial\": \"%s\", "
               "\"pci_bus_id\": \"%s\", \"pci_device_id\": \"0x%08X\", \"numa_node\": %u, "
               "\"memory_total_bytes\": %llu, \"compute_capability\": \"%d.%d\", "
               "\"driver_version\": \"%s\", \"cuda_driver_version\": \"%d.%d\", "
               "\"vbios_version\": \"%s\", \"mig_capable\": %s, \"mig_enabled\": %s, "
               "\"mig_pending\": %s, \"instances\": [",
               i ? ", " : "", index, uuid, name, serial, pci.busId, pci.pciDeviceId, numa,
               mem.total, major, minor, driver, cuda / 1000, cuda % 1000 / 10, vbios,
               mig == NVML_SUCCESS ? "true" : "false", current ? "true" : "false",
               pending ? "true" : "false");
        unsigned int max = 0;
        if (mig == NVML_SUCCESS && current)
            CHECK(nvmlDeviceGetMaxMigDeviceCount(dev, &max));
        int first = 1;
        for (unsigned int m = 0; m < max; m++) {
            nvmlDevice_t migdev, parent;
            nvmlGpuInstance_t gi;
            nvmlGpuInstanceInfo_t info;
            nvmlGpuInstanceProfileInfo_v2_t profile = {.version = nvmlGpuInstanceProfileInfo_v2};
            nvmlDeviceAttributes_t attrs;
            unsigned int gi_id, ci_id, is_mig;
            if (nvmlDeviceGetMigDeviceHandleByIndex(dev, m, &migdev) == NVML_ERROR_NOT_FOUND)
                continue;
            CHECK(nvmlDeviceIsMigDeviceHandle(migdev, &is_mig));
            CHECK(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migdev, &parent));
            CHECK(nvmlDeviceGetUUID(migdev, uuid, sizeof uuid));
            CHECK(nvmlDeviceGetGpuInstanceId(migdev, &gi_id));
            CHECK(nvmlDeviceGetComputeInstanceId(migdev, &ci_id));
            CHECK(nvmlDeviceGetAttributes_v2(migdev, &attrs));
            CHECK(nvmlDeviceGetGpuInstanceById(dev, gi_id, &gi));
            CHECK(nvmlGpuInstanceGetInfo(gi, &info));
            const char *profile_name = "?";
            for (unsigned int p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; p++) {
                if (nvmlDeviceGetGpuInstanceProfileInfoV(dev, p, &profile) == NVML_SUCCESS &&
                    profile.id == info.profileId) {
                    profile_name = strncmp(profile.name, "MIG ", 4) == 0 ? profile.name + 4
                                                                         : profile.name;
                    break;
                }
            }
            printf("%s{\"uuid\": \"%s\", \"instance_id\": %u, \"compute_instance_id\": %u, "
                   "\"profile\": \"%s\", \"placement\": {\"start\": %u, \"size\": %u}, "
                   "\"memory_mb\": %llu, \"is_mig\": %u, \"parent_is_gpu\": %s}",
                   first ? "" : ", ", uuid, gi_id, ci_id, profile_name, info.placement.start,
                   info.placement.size, attrs.memorySizeMB, is_mig,
                   parent.handle == dev.handle ? "true" : "false");
            first = 0;
        }
        printf("]}");
    }
    printf("]}\n");
}

static volatile int waiting = 1;

static void *hammer(void *calls) {
    while (waiting) {
        unsigned int count;
        CHECK(nvmlDeviceGetCount_v2(&count));
        ++*(long *)calls;
    }
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void events(unsigned int timeout_ms) {
    nvmlEventSet_t set;
    unsigned int count;
    CHECK(nvmlEventSetCreate(&set));
    CHECK(nvmlDeviceGetCount_v2(&count));
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        CHECK(nvmlDeviceGetHandleByIndex_v2(i, &dev));
        CHECK(nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, set));
    }
    printf("ready\n");
    fflush(stdout);
    long calls = 0;
    pthread_t other;
    pthread_create(&other, NULL, hammer, &calls);
    nvmlEventData_t data;
    double start = now();
    nvmlReturn_t rc = nvmlEventSetWait_v2(set, &data, timeout_ms);
    double waited = now() - start;
    waiting = 0;
    pthread_join(other, NULL);
    unsigned int index = 0;
    if (rc == NVML_SUCCESS)
        CHECK(nvmlDeviceGetIndex(data.device, &index));
    printf("{\"rc\": %d, \"error\": \"%s\", \"waited_s\": %.3f, \"other_calls\": %ld, "
           "\"gpu\": %u, \"xid\": %llu}\n",
           rc, nvmlErrorString(rc), waited, calls, index,
           rc == NVML_SUCCESS ? data.eventData : 0ULL);
    CHECK(nvmlEventSetFree(set));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: probe json | probe events TIMEOUT_MS\n");
        return 2;
    }
    CHECK(nvmlInit_v2());
    if (strcmp(argv[1], "json") == 0)
        json_gpus();
    else if (strcmp(argv[1], "events") == 0 && argc == 3)
        events((unsigned int)atoi(argv[2]));
    else
        return 2;
    CHECK(nvmlShutdown());
    return 0;
}
