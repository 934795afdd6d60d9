// Command fakecri serves Kubernetes' fake CRI runtime (k8s.io/cri-client/pkg/fake) on a unix
// socket for a real kubelet in the tests. It starts no process: it accepts every pod and
// container the kubelet asks for and appends each CreateContainer request (environment, device
// nodes, mounts, CDI devices, annotations) as one JSON line to the --requests file, which is how
// a test sees what a container would have been given.
//
// Two things the upstream fake leaves out that a real kubelet needs, filled in here:
//   - every container reports a log path under its pod's log directory. The kubelet removes
//     "<log path>*" when it removes a container; with the fake's empty log path that glob is "*"
//     in the kubelet's working directory, which deletes whatever is there.
//   - pulled images have a size and the image filesystem is reported, without which kubelet 1.37
//     fails pods with ImageInspectError and its eviction manager finds no image filesystem.
//
// And one thing for tests of what happens between a pod's admission and its container's start:
// while a file named "<namespace>_<pod>" exists in --hold-dir, CreateContainer for that pod
// fails (the kubelet retries it), so a test can restart the kubelet after the pod's resources
// were prepared and before its container exists.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// runtime overrides CreateContainer of the upstream fake; every other call goes to it.
type runtime struct {
	*fake.RemoteRuntime
	mu       sync.Mutex
	requests *os.File
	holdDir  string
}

func (r *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	if r.holdDir != "" {
		meta := req.GetSandboxConfig().GetMetadata()
		hold := filepath.Join(r.holdDir, meta.GetNamespace()+"_"+meta.GetName())
		if _, err := os.Stat(hold); err == nil {
			return nil, fmt.Errorf("fakecri: CreateContainer for pod %s/%s held while %s exists",
				meta.GetNamespace(), meta.GetName(), hold)
		}
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath())
	if req.GetSandboxConfig().GetLogDirectory() == "" || req.GetConfig().GetLogPath() == "" {
		// Never report an empty or relative log path (see the package comment).
		logPath = filepath.Join("/var/log/pods", resp.ContainerId+".log")
	}
	svc := r.RuntimeService
	svc.Lock()
	if c, ok := svc.Containers[resp.ContainerId]; ok {
		c.LogPath = logPath
	}
	svc.Unlock()

	line, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("fakecri: encode request: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.requests.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("fakecri: record request: %w", err)
	}
	return resp, nil
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve the CRI on, e.g. unix:///run/fakecri.sock")
	requests := flag.String("requests", "", "file each CreateContainer request is appended to, one JSON object a line")
	imageFs := flag.String("image-fs", "/var/lib/kubelet", "mount point reported as the image filesystem")
	holdDir := flag.String("hold-dir", "", "CreateContainer fails for a pod while a file <namespace>_<pod> exists here")
	flag.Parse()
	if *endpoint == "" || *requests == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --endpoint and --requests are required")
		os.Exit(2)
	}
	out, err := os.OpenFile(*requests, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(2)
	}

	upstream := fake.NewFakeRemoteRuntime()
	upstream.ImageService.SetFakeImageSize(1 << 20)
	usage := []*kubeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &kubeapi.FilesystemIdentifier{Mountpoint: *imageFs},
		UsedBytes:  &kubeapi.UInt64Value{Value: 1 << 20},
		InodesUsed: &kubeapi.UInt64Value{Value: 1},
	}}
	upstream.ImageService.SetFakeFilesystemUsage(usage)
	upstream.ImageService.SetFakeContainerFilesystemUsage(usage)
	upstream.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	r := &runtime{RemoteRuntime: upstream, requests: out, holdDir: *holdDir}

	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, r)
	kubeapi.RegisterImageServiceServer(server, r)
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: listen on %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "fakecri: serving on %s\n", *endpoint)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(1)
	}
}
