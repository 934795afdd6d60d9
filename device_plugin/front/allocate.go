package main

// Allocate from the agent's table: the same checks, in the same order, with the same messages
// and the same runtime instructions as device_plugin/allocate.py, which stays the definition
// (tests/device_plugin/test_front.py holds the two equal on every request it sends).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	visibleDevices  = "NVIDIA_VISIBLE_DEVICES"
	volumeMountRoot = "/var/run/nvidia-container-devices"
	mpsPipeEnv      = "CUDA_MPS_PIPE_DIRECTORY"
	maxIDsShown     = 10
	// Up to this many devices, sets are slices scanned in order: the few IDs of a container's
	// request cost less to compare than to hash into a map, on a path every call takes.
	linearScanMax = 32
)

// controlDevices: nvidiactl is always passed, the others if present.
var controlDevices = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

type device struct {
	id        string
	UUID      string  `json:"uuid"`
	GPUUUID   string  `json:"gpu_uuid"`
	Shared    bool    `json:"shared"`
	Strict    bool    `json:"strict"` // shared, and a request of more than one is refused
	MPS       bool    `json:"mps"`    // its GPU is shared through MPS
	Unhealthy *string `json:"unhealthy"`
	Minor     int     `json:"minor"`
}

type mpsMounts struct {
	ContainerPipeDir string `json:"container_pipe_dir"`
	HostPipeDir      string `json:"host_pipe_dir"`
	HostShmDir       string `json:"host_shm_dir"`
}

type table struct {
	Resource            string               `json:"resource"`
	Devices             map[string]*device   `json:"devices"`
	VisibleDevicesEnv   bool                 `json:"visible_devices_env"`
	VolumeMounts        bool                 `json:"volume_mounts"`
	CDIKind             string               `json:"cdi_kind"`
	CDIAnnotationPrefix *string              `json:"cdi_annotation_prefix"`
	CDICRI              bool                 `json:"cdi_cri"`
	OwnCDINames         map[string]string    `json:"own_cdi_names"` // nil: the cdi strategy is off
	DevRoot             *string              `json:"dev_root"`      // nil: no device specs
	MPS                 map[string]mpsMounts `json:"mps"`
}

func parseTable(data []byte) (*table, error) {
	var t table
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, err
	}
	if t.Resource == "" {
		return nil, fmt.Errorf("no resource")
	}
	for id, d := range t.Devices {
		if d == nil {
			return nil, fmt.Errorf("device %s: null", id)
		}
		d.id = id
	}
	return &t, nil
}

func idList(ids []string) string {
	if len(ids) <= maxIDsShown {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s (and %d more)", strings.Join(ids[:maxIDsShown], ", "), len(ids)-maxIDsShown)
}

func refuse(code codes.Code, format string, args ...any) error {
	err := status.Errorf(code, format, args...)
	// The agent relays this line into its own log, as it logs its own refusals.
	fmt.Fprintf(os.Stderr, "Allocate refused: %s\n", status.Convert(err).Message())
	return err
}

func (t *table) allocate(in []byte) ([]byte, error) {
	containers, err := decodeAllocateRequest(in)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	chosen := make([][]*device, 0, len(containers))
	for _, ids := range containers {
		devices, err := t.validate(ids)
		if err != nil {
			return nil, err
		}
		chosen = append(chosen, devices)
	}
	if shared := sharedAcross(chosen); len(shared) > 0 {
		return nil, refuse(codes.InvalidArgument,
			"%s: device(s) requested by more than one container of the pod: %s",
			t.Resource, idList(shared))
	}
	answers := make([]containerAnswer, len(chosen))
	for n, devices := range chosen {
		t.answer(&answers[n], devices)
	}
	return encodeAllocateResponse(answers), nil
}

// sharedAcross is the devices asked for by more than one of the pod's containers.
func sharedAcross(chosen [][]*device) []string {
	if len(chosen) < 2 {
		return nil
	}
	owners := map[string]int{}
	var shared []string
	for n, container := range chosen {
		for _, d := range container {
			// An exclusive GPU is one device whatever ID names it; replicas are distinct.
			key := d.UUID
			if d.Shared {
				key = d.id
			}
			owner, seen := owners[key]
			if !seen {
				owners[key] = n
			} else if owner != n && !contains(shared, d.id) {
				shared = append(shared, d.id)
			}
		}
	}
	return shared
}

func (t *table) validate(ids []string) ([]*device, error) {
	r := t.Resource
	if len(ids) == 0 {
		return nil, refuse(codes.InvalidArgument, "%s: no device IDs", r)
	}
	if hasDuplicates(ids) {
		counts := map[string]int{}
		for _, id := range ids {
			counts[id]++
		}
		var duplicates []string
		for id, n := range counts {
			if n > 1 {
				duplicates = append(duplicates, id)
			}
		}
		sort.Strings(duplicates)
		return nil, refuse(codes.InvalidArgument,
			"%s: duplicate device IDs in one container: %s", r, idList(duplicates))
	}
	var unknown []string
	chosen := make([]*device, 0, len(ids))
	for _, id := range ids {
		if d, ok := t.Devices[id]; ok {
			chosen = append(chosen, d)
		} else {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) > 0 {
		return nil, refuse(codes.InvalidArgument,
			"%s: %d unknown device ID(s): %s", r, len(unknown), idList(unknown))
	}
	var sick []string
	for _, d := range chosen {
		if d.Unhealthy != nil {
			sick = append(sick, fmt.Sprintf("%s (%s)", d.id, *d.Unhealthy))
		}
	}
	if len(sick) > 0 {
		detail := strings.Join(sick[:min(len(sick), maxIDsShown)], "; ")
		if len(sick) > maxIDsShown {
			detail += fmt.Sprintf(" (and %d more)", len(sick)-maxIDsShown)
		}
		return nil, refuse(codes.FailedPrecondition, "%s: unhealthy devices: %s", r, detail)
	}
	var strict []string
	for _, d := range chosen {
		if d.Strict {
			strict = append(strict, d.id)
		}
	}
	if len(chosen) > 1 && len(strict) > 0 {
		return nil, refuse(codes.InvalidArgument,
			"request for '%s: %d' too large: maximum request size for shared resources is 1 "+
				"(shared devices: %s)", r, len(chosen), idList(strict))
	}
	if !slices.ContainsFunc(chosen, func(d *device) bool { return d.MPS }) {
		return chosen, nil // the MPS rule below is all that is left
	}
	mpsGPUs := map[string]bool{}
	gpus := map[string]bool{}
	for _, d := range chosen {
		gpus[d.GPUUUID] = true
		if d.MPS {
			mpsGPUs[d.GPUUUID] = true
		}
	}
	if len(mpsGPUs) > 1 || len(gpus) > 1 {
		names := make([]string, 0, len(mpsGPUs))
		for g := range mpsGPUs {
			names = append(names, g)
		}
		sort.Strings(names)
		return nil, refuse(codes.InvalidArgument,
			"%s: devices %s span several GPUs including MPS GPU(s) %s; a container can reach "+
				"only one MPS daemon", r, idList(ids), idList(names))
	}
	return chosen, nil
}

// answer fills in one container's runtime instructions.
func (t *table) answer(a *containerAnswer, chosen []*device) {
	uuids := unique(chosen, func(d *device) string { return d.UUID }) // replicas name a GPU once
	if t.VisibleDevicesEnv {
		a.setEnv(visibleDevices, strings.Join(uuids, ","))
	}
	if t.VolumeMounts {
		a.setEnv(visibleDevices, volumeMountRoot)
		for _, uuid := range uuids {
			a.mounts = append(a.mounts, mount{
				containerPath: volumeMountRoot + "/" + uuid, hostPath: "/dev/null", readOnly: true,
			})
		}
	}
	if t.CDIAnnotationPrefix != nil || t.CDICRI {
		names := make([]string, len(uuids))
		for i, uuid := range uuids {
			names[i] = t.CDIKind + "=" + uuid
		}
		if t.CDIAnnotationPrefix != nil {
			digest := sha256.Sum256([]byte(strings.Join(uuids, ",")))
			key := *t.CDIAnnotationPrefix + "nodeagent-device-plugin_" + hex.EncodeToString(digest[:])[:16]
			a.annotations = append(a.annotations, pair{key, strings.Join(names, ",")})
		}
		if t.CDICRI {
			a.cdiDevices = append(a.cdiDevices, names...)
		}
	}
	if t.OwnCDINames != nil {
		for _, uuid := range uuids {
			a.cdiDevices = append(a.cdiDevices, t.OwnCDINames[uuid])
		}
	}
	if t.DevRoot != nil {
		t.addDeviceSpecs(a, chosen, *t.DevRoot)
	}
	for _, gpu := range unique(chosen, func(d *device) string { return d.GPUUUID }) {
		paths, ok := t.MPS[gpu]
		if !ok {
			continue
		}
		if t.OwnCDINames == nil { // the agent's CDI device mounts the pipe and sets the env itself
			a.setEnv(mpsPipeEnv, paths.ContainerPipeDir)
			a.mounts = append(a.mounts, mount{
				containerPath: paths.ContainerPipeDir, hostPath: paths.HostPipeDir,
			})
		}
		a.mounts = append(a.mounts, mount{containerPath: "/dev/shm", hostPath: paths.HostShmDir})
	}
}

func (t *table) addDeviceSpecs(a *containerAnswer, chosen []*device, devRoot string) {
	paths := unique(chosen, func(d *device) string { return fmt.Sprintf("nvidia%d", d.Minor) })
	paths = append(paths, controlDevices[0])
	for _, name := range controlDevices[1:] {
		if _, err := os.Stat(filepath.Join(devRoot, name)); err == nil {
			paths = append(paths, name)
		}
	}
	for _, name := range paths {
		a.devices = append(a.devices, deviceSpec{
			containerPath: "/dev/" + name, hostPath: filepath.Join(devRoot, name), permissions: "rw",
		})
	}
}

// unique is key of each device, first appearance first.
func unique(devices []*device, key func(*device) string) []string {
	out := make([]string, 0, len(devices))
	var seen map[string]bool // only for long lists: for a few, scanning out costs less
	if len(devices) > linearScanMax {
		seen = make(map[string]bool, len(devices))
	}
	for _, d := range devices {
		k := key(d)
		if seen != nil {
			if seen[k] {
				continue
			}
			seen[k] = true
		} else if contains(out, k) {
			continue
		}
		out = append(out, k)
	}
	return out
}

// hasDuplicates is whether an ID appears twice.
func hasDuplicates(ids []string) bool {
	if len(ids) > linearScanMax {
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			if seen[id] {
				return true
			}
			seen[id] = true
		}
		return false
	}
	for i, id := range ids {
		if contains(ids[:i], id) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
