package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

const allocateMethod = "/v1beta1.DevicePlugin/Allocate"

// raw passes messages through as bytes: the front decodes only what it answers itself.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }

func (raw) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

// Name is "proto" so that peers see the content type they expect.
func (raw) Name() string { return "proto" }

// socket is one resource's DevicePlugin endpoint.
type socket struct {
	path     string
	identity [2]uint64 // device and inode of the socket file bound, removed only if still ours
	server   *grpc.Server
	upstream *grpc.ClientConn
	table    atomic.Pointer[table]
}

func serve(path, upstream string) (*socket, error) {
	conn, err := grpc.NewClient("unix://"+upstream,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(raw{})))
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", upstream, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		conn.Close()
		return nil, fmt.Errorf("removing the old %s: %w", path, err)
	}
	listener, err := net.Listen("unix", path)
	if err != nil {
		conn.Close()
		return nil, err
	}
	listener.(*net.UnixListener).SetUnlinkOnClose(false)
	var st syscall.Stat_t
	// Only the kubelet (root) may talk to the plugin.
	if err := os.Chmod(path, 0o600); err == nil {
		err = syscall.Stat(path, &st)
	}
	if err != nil {
		listener.Close()
		conn.Close()
		return nil, err
	}
	s := &socket{path: path, identity: [2]uint64{st.Dev, st.Ino}, upstream: conn}
	s.server = grpc.NewServer(grpc.ForceServerCodec(raw{}), grpc.UnknownServiceHandler(s.forward))
	// Allocate as a unary method, so its answer goes out in one write (headers, message and
	// status together), as a generated server's does; every other method falls through to
	// forward, which gRPC gives the methods of a service it does not know in full.
	s.server.RegisterService(&grpc.ServiceDesc{
		ServiceName: "v1beta1.DevicePlugin",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Allocate", Handler: s.allocate}},
	}, s)
	go s.server.Serve(listener) //nolint:errcheck // ends when close stops the server
	return s, nil
}

// close stops serving (open streams end) and removes the socket file if it is still ours.
func (s *socket) close() {
	s.server.Stop()
	s.upstream.Close()
	var st syscall.Stat_t
	if syscall.Stat(s.path, &st) == nil && [2]uint64{st.Dev, st.Ino} == s.identity {
		os.Remove(s.path)
	}
}

// allocate answers from the table, or, before the agent has sent one, passes the call on.
func (s *socket) allocate(_ any, ctx context.Context, decode func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var in []byte
	if err := decode(&in); err != nil {
		return nil, err
	}
	var out []byte
	var err error
	if t := s.table.Load(); t != nil {
		out, err = t.allocate(in)
	} else {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
		err = s.upstream.Invoke(ctx, allocateMethod, &in, &out)
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// forward relays one call, unary or streaming, to the agent's server and its answer back:
// messages, headers, trailers and the final status as they are.
func (s *socket) forward(_ any, down grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(down)
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	if md, ok := metadata.FromIncomingContext(down.Context()); ok {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	up, err := s.upstream.NewStream(ctx, desc, method)
	if err != nil {
		return err
	}
	go func() {
		for {
			var msg []byte
			if err := down.RecvMsg(&msg); err != nil {
				if err == io.EOF {
					up.CloseSend() //nolint:errcheck // the call's status reports any failure
				} else {
					cancel()
				}
				return
			}
			if err := up.SendMsg(&msg); err != nil {
				return
			}
		}
	}()
	headerSent := false
	for {
		var msg []byte
		err := up.RecvMsg(&msg)
		if !headerSent {
			if header, herr := up.Header(); herr == nil && len(header) > 0 {
				down.SendHeader(header) //nolint:errcheck // a broken stream fails the next send
			}
			headerSent = true
		}
		if err != nil {
			down.SetTrailer(up.Trailer())
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := down.SendMsg(&msg); err != nil {
			return err
		}
	}
}
