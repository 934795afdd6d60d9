// Command nodeagent-device-plugin-front serves the kubelet's DevicePlugin API on the agent's
// behalf, so that Allocate, the call on every container start, is answered without a trip
// through Python's gRPC server (docs/device-plugin.md, "The Allocate front").
//
// The agent starts it and speaks to it over stdin and stdout, one JSON object per line, one
// reply line ({"ok": true} or {"error": "..."}) per request, in order:
//
//	{"op": "serve", "socket": PATH, "upstream": PATH}  listen on PATH (mode 0600); every call
//	                                                   but Allocate goes to the agent's own
//	                                                   server on UPSTREAM, as it is
//	{"op": "table", "socket": PATH, "table": {...}}    answer Allocate on PATH from this table
//	{"op": "close", "socket": PATH}                    stop serving PATH and remove it
//
// The table (allocate.go) holds what the agent's Allocate reads: each device's identity, health
// and sharing, and the runtime instructions the configured strategies ask for. Until a socket
// has a table, Allocate goes to the agent too. When stdin closes (the agent is gone), every
// socket is closed and the program exits.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sync"
)

// request is one line of the control protocol.
type request struct {
	Op       string          `json:"op"`
	Socket   string          `json:"socket"`
	Upstream string          `json:"upstream"`
	Table    json.RawMessage `json:"table"`
}

type reply struct {
	OK    bool   `json:"ok,omitempty"`
	Error string `json:"error,omitempty"`
}

// front is every socket served, by path.
type front struct {
	mu      sync.Mutex
	sockets map[string]*socket
}

func (f *front) handle(req request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch req.Op {
	case "serve":
		if req.Socket == "" || req.Upstream == "" {
			return fmt.Errorf("serve needs socket and upstream")
		}
		if old := f.sockets[req.Socket]; old != nil {
			old.close()
		}
		s, err := serve(req.Socket, req.Upstream)
		if err != nil {
			return err
		}
		if old := f.sockets[req.Socket]; old != nil {
			s.table.Store(old.table.Load())
		}
		f.sockets[req.Socket] = s
	case "table":
		s := f.sockets[req.Socket]
		if s == nil {
			return fmt.Errorf("no socket %s is served", req.Socket)
		}
		t, err := parseTable(req.Table)
		if err != nil {
			return fmt.Errorf("table for %s: %w", req.Socket, err)
		}
		s.table.Store(t)
	case "close":
		if s := f.sockets[req.Socket]; s != nil {
			s.close()
			delete(f.sockets, req.Socket)
		}
	default:
		return fmt.Errorf("unknown op %q", req.Op)
	}
	return nil
}

func (f *front) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for path, s := range f.sockets {
		s.close()
		delete(f.sockets, path)
	}
}

func main() {
	// One P unless the operator sets GOMAXPROCS: the kubelet calls Allocate one container at a
	// time and each answer is microseconds of work, so a second P only adds a wake-up of
	// another thread to every call (measured on a 2-core VM: a third fewer context switches
	// per call and 0.016 ms less at p50; docs/benchmarks.md).
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	f := &front{sockets: map[string]*socket{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 64<<20) // a table of many replicas is a long line
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var answer reply
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer.Error = "not a JSON request: " + err.Error()
		} else if err := f.handle(req); err != nil {
			answer.Error = err.Error()
		} else {
			answer.OK = true
		}
		if err := out.Encode(answer); err != nil {
			break // the agent is gone
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "the Allocate front stops: reading requests: %v\n", err)
	}
	f.closeAll()
}
