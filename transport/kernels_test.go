package transport

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestHandshakeRefusesMixedKernels: two stages computing with different
// matrix kernels (the same OpenBLAS choosing Zen on one host, Prescott on
// another) do not link; the refusal names both sets and the config key
// that fixes one. Replicas of a stage are held to it the same way.
func TestHandshakeRefusesMixedKernels(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(2)
	up.Kernels, down.Kernels = "OpenBLAS Zen", "OpenBLAS Prescott"
	srv, err := Listen("127.0.0.1:0", down, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{})
	if err == nil || !strings.Contains(err.Error(), `matrix kernels "OpenBLAS Zen" differ from "OpenBLAS Prescott"`) || !strings.Contains(err.Error(), "compute.blas_kernels") {
		t.Errorf("mixed kernels over a link: %v", err)
	}
	r0, r1 := replicaHellos(2, [][]int{{4}})
	r0.Kernels, r1.Kernels = "OpenBLAS Haswell", "gonum"
	if err := CheckPeer(r1, r0, false); err == nil || !strings.Contains(err.Error(), `matrix kernels "OpenBLAS Haswell" differ from "gonum"`) {
		t.Errorf("mixed kernels on the replica ring: %v", err)
	}
	r1.Kernels = r0.Kernels
	if err := CheckPeer(r1, r0, false); err != nil {
		t.Errorf("the same kernels: %v", err)
	}
}

// TestHandshakeKernelsField: the kernels travel behind a flag, so a hello
// without them encodes as before; with them they round-trip, are bounded
// like the other texts, and the flag without text is refused.
func TestHandshakeKernelsField(t *testing.T) {
	up, _ := hellos(2)
	plain := (&handshake{Hello: up}).marshal()
	up.Kernels = "OpenBLAS Cooperlake"
	in := &handshake{Hello: up}
	b := in.marshal()
	if plain[4]&flagKernels != 0 || b[4]&flagKernels == 0 || !bytes.Contains(b, []byte("\x13\x00\x00\x00OpenBLAS Cooperlake\x01\x00\x00\x00")) {
		t.Fatalf("the kernels should set their flag and follow the refusal:\n%x\n%x", plain, b)
	}
	var out handshake
	if err := out.unmarshal(b); err != nil || !reflect.DeepEqual(&out, in) {
		t.Fatalf("round trip: %v, %+v", err, out)
	}
	flagOnly := append([]byte(nil), plain...)
	flagOnly[4] |= flagKernels
	if err := out.unmarshal(flagOnly); err == nil {
		t.Error("a kernels flag with no kernels was accepted")
	}
	up.Kernels = strings.Repeat("k", maxHelloText+1)
	if err := up.validate(); err == nil || !strings.Contains(err.Error(), "kernels") {
		t.Errorf("over-long kernels: %v", err)
	}
	long := (&handshake{Hello: up}).marshal()
	if err := out.unmarshal(long); err == nil || !strings.Contains(err.Error(), "kernels of 1025 bytes exceeds") {
		t.Errorf("over-long kernels decoded: %v", err)
	}
}
