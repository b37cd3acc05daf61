package gpu

import (
	"fmt"
	"sync"

	"github.com/pipetrain/pipetrain/compute"
)

// Device is a compute.Device whose chunks are Stages on the backends open
// makes, one per device index, shared by every chunk placed on that index
// (several stages on one GPU).
type Device struct {
	kind string
	open func(index int) (Backend, error)

	mu       sync.Mutex
	backends map[int]Backend
}

// NewDevice is the device kind whose device N is open(N).
func NewDevice(kind string, open func(index int) (Backend, error)) *Device {
	return &Device{kind: kind, open: open, backends: map[int]Backend{}}
}

func (d *Device) Kind() string { return d.kind }

// Open builds the chunk on device s.Index, opening the device the first
// time a chunk is placed on it.
func (d *Device) Open(s compute.Spec) (compute.Stage, error) {
	be, err := d.Backend(s.Index)
	if err != nil {
		return nil, err
	}
	return NewStage(be, s)
}

// Backend is device index's backend, opened on first use.
func (d *Device) Backend(index int) (Backend, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if be, ok := d.backends[index]; ok {
		return be, nil
	}
	be, err := d.open(index)
	if err != nil {
		return nil, fmt.Errorf("%s:%d: %w", d.kind, index, err)
	}
	d.backends[index] = be
	return be, nil
}
