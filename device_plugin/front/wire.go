package main

// Allocate's request and answer in protobuf's wire format, read and written by hand: the front
// wakes for one call at a time with its caches cold, and protobuf-go's table-driven Unmarshal
// and Marshal (and the generated types they fill) then cost more than everything else the
// answer takes (measured: docs/benchmarks.md). Field numbers are those of the kubelet's
// deviceplugin v1beta1 api.proto; tests/device_plugin/test_front.py decodes every answer with
// the generated types and holds it equal to the agent's.

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// AllocateRequest.container_requests = 1; ContainerAllocateRequest.devices_ids = 1.
const (
	fieldContainerRequests protowire.Number = 1
	fieldDevicesIDs        protowire.Number = 1
)

// ContainerAllocateResponse's fields; AllocateResponse.container_responses = 1.
const (
	fieldContainerResponses protowire.Number = 1
	fieldEnvs               protowire.Number = 1 // map<string, string>
	fieldMounts             protowire.Number = 2
	fieldDevices            protowire.Number = 3
	fieldAnnotations        protowire.Number = 4 // map<string, string>
	fieldCDIDevices         protowire.Number = 5
)

var errInvalidUTF8 = errors.New("string field contains invalid UTF-8")

type pair struct{ key, value string }

type mount struct {
	containerPath, hostPath string
	readOnly                bool
}

type deviceSpec struct{ containerPath, hostPath, permissions string }

// containerAnswer is one ContainerAllocateResponse.
type containerAnswer struct {
	envs        []pair // a map on the wire: one entry per key
	mounts      []mount
	devices     []deviceSpec
	annotations []pair
	cdiDevices  []string
}

func (a *containerAnswer) setEnv(key, value string) {
	for i := range a.envs {
		if a.envs[i].key == key {
			a.envs[i].value = value
			return
		}
	}
	a.envs = append(a.envs, pair{key, value})
}

// decodeAllocateRequest returns each container's device IDs. Unknown fields, and known ones of
// another wire type, are skipped, as protobuf-go does.
func decodeAllocateRequest(b []byte) ([][]string, error) {
	var containers [][]string
	err := eachField(b, func(num protowire.Number, typ protowire.Type, value []byte) error {
		if num != fieldContainerRequests || typ != protowire.BytesType {
			return nil
		}
		ids := []string{}
		err := eachField(value, func(num protowire.Number, typ protowire.Type, value []byte) error {
			if num == fieldDevicesIDs && typ == protowire.BytesType {
				if !utf8.Valid(value) {
					return errInvalidUTF8
				}
				ids = append(ids, string(value))
			}
			return nil
		})
		containers = append(containers, ids)
		return err
	})
	return containers, err
}

// eachField calls visit with each field of a message; value is a length-delimited field's
// contents, nil for other wire types.
func eachField(b []byte, visit func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var value []byte
		if typ == protowire.BytesType {
			value, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := visit(num, typ, value); err != nil {
			return err
		}
	}
	return nil
}

func encodeAllocateResponse(answers []containerAnswer) []byte {
	var out, body []byte
	for i := range answers {
		body = answers[i].append(body[:0])
		out = appendBytesField(out, fieldContainerResponses, body)
	}
	return out
}

// append writes the fields in field-number order, leaving out empty strings and false as
// proto3 does.
func (a *containerAnswer) append(b []byte) []byte {
	var item []byte
	for _, env := range a.envs {
		item = appendPair(item[:0], env)
		b = appendBytesField(b, fieldEnvs, item)
	}
	for _, m := range a.mounts {
		item = appendString(item[:0], 1, m.containerPath)
		item = appendString(item, 2, m.hostPath)
		if m.readOnly {
			item = protowire.AppendTag(item, 3, protowire.VarintType)
			item = protowire.AppendVarint(item, 1)
		}
		b = appendBytesField(b, fieldMounts, item)
	}
	for _, d := range a.devices {
		item = appendString(item[:0], 1, d.containerPath)
		item = appendString(item, 2, d.hostPath)
		item = appendString(item, 3, d.permissions)
		b = appendBytesField(b, fieldDevices, item)
	}
	for _, annotation := range a.annotations {
		item = appendPair(item[:0], annotation)
		b = appendBytesField(b, fieldAnnotations, item)
	}
	for _, name := range a.cdiDevices {
		item = appendString(item[:0], 1, name)
		b = appendBytesField(b, fieldCDIDevices, item)
	}
	return b
}

// appendPair is a map entry: key = 1 and value = 2, both always written.
func appendPair(b []byte, p pair) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, p.key)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendString(b, p.value)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytesField(b []byte, num protowire.Number, value []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, value)
}
