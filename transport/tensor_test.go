package transport

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestTensorRoundTrip(t *testing.T) {
	f32, err := FromFloat32s(Activation, 7, 3, []int{2, 3}, []float32{1, -2, 3.5, float32(math.Inf(1)), 0, 6})
	if err != nil {
		t.Fatal(err)
	}
	f64, err := FromFloat64s(Gradient, -1, 0, []int{4}, []float64{1e300, -2, math.Pi, 0})
	if err != nil {
		t.Fatal(err)
	}
	scalar, err := FromFloat32s(Activation, 1, 1, nil, []float32{42})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]*Tensor{
		"float32 2x3":     f32,
		"float64 4":       f64,
		"rank 0":          scalar,
		"zero-size dim":   {Kind: Gradient, Step: 1 << 40, MicroBatch: -5, Chunk: 2, DType: Float64, Shape: []int{3, 0, 5}},
		"rank 8":          {Kind: Activation, DType: Float32, Shape: []int{1, 1, 1, 1, 1, 1, 2, 1}, Data: make([]byte, 8)},
		"empty 1-D":       {Kind: Activation, DType: Float32, Shape: []int{0}},
		"big step and mb": {Kind: Gradient, Step: math.MaxInt64, MicroBatch: math.MaxInt32, DType: Float32, Shape: []int{1}, Data: []byte{1, 2, 3, 4}},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := in.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var out Tensor
			if err := out.UnmarshalBinary(b); err != nil {
				t.Fatal(err)
			}
			if out.Kind != in.Kind || out.Step != in.Step || out.MicroBatch != in.MicroBatch || out.Chunk != in.Chunk ||
				out.DType != in.DType || !slices.Equal(out.Shape, in.Shape) || !bytes.Equal(out.Data, in.Data) {
				t.Fatalf("round trip changed the tensor:\n in %+v\nout %+v", in, out)
			}
			b[len(b)-1]++ // UnmarshalBinary must have copied
			if len(out.Data) > 0 && out.Data[len(out.Data)-1] != in.Data[len(in.Data)-1] {
				t.Fatal("decoded Data aliases the input")
			}
		})
	}
	if got := f32.Float32s(); !slices.Equal(got, []float32{1, -2, 3.5, float32(math.Inf(1)), 0, 6}) {
		t.Errorf("Float32s = %v", got)
	}
	if got := f64.Float64s(); !slices.Equal(got, []float64{1e300, -2, math.Pi, 0}) {
		t.Errorf("Float64s = %v", got)
	}
	if f32.Float64s() != nil || f64.Float32s() != nil {
		t.Error("accessor of the wrong dtype should return nil")
	}
	// Unaligned data takes the converting path.
	odd := make([]byte, 9)
	binary.LittleEndian.PutUint32(odd[1:], math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(odd[5:], math.Float32bits(-3))
	u := Tensor{DType: Float32, Data: odd[1:]}
	if got := u.Float32s(); !slices.Equal(got, []float32{1.5, -3}) {
		t.Errorf("unaligned Float32s = %v", got)
	}
	if _, err := FromFloat32s(Activation, 0, 0, []int{2, 2}, []float32{1}); err == nil ||
		!strings.Contains(err.Error(), "payload is 4 bytes, shape [2 2] float32 needs 16") {
		t.Errorf("FromFloat32s with the wrong length: %v", err)
	}
}

func TestDType(t *testing.T) {
	for _, d := range []DType{Float32, Float64} {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
	}
	if Float32.Size() != 4 || Float64.Size() != 8 || DType(9).Size() != 0 {
		t.Error("wrong sizes")
	}
	if _, err := ParseDType("bfloat16"); err == nil {
		t.Error("ParseDType accepted bfloat16")
	}
}

// header builds a raw header, so the decoder can be fed what the encoder
// would refuse to produce.
func header(kind, dtype, rank byte, dims ...uint64) []byte {
	b := make([]byte, fixedHeader, fixedHeader+8*len(dims))
	copy(b, tensorMagic)
	b[4], b[5], b[6], b[7] = tensorVersion, kind, dtype, rank
	for _, d := range dims {
		b = binary.LittleEndian.AppendUint64(b, d)
	}
	return b
}

func TestTensorDecodeRejects(t *testing.T) {
	good := append(header(1, 1, 2, 2, 3), make([]byte, 24)...)
	var ok Tensor
	if err := ok.UnmarshalBinary(good); err != nil {
		t.Fatalf("good frame rejected: %v", err)
	}
	with := func(i int, v byte) []byte { b := slices.Clone(good); b[i] = v; return b }
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "0 bytes is shorter than the 24-byte header"},
		{"truncated fixed header", good[:10], "10 bytes is shorter"},
		{"truncated dims", good[:30], "30 bytes is shorter than the 40-byte header of a rank-2 tensor"},
		{"truncated payload", good[:50], "payload is 10 bytes, shape [2 3] float32 needs 24"},
		{"bad magic", with(0, 'X'), "bad magic"},
		{"bad version", with(4, 9), "unsupported version 9"},
		{"bad kind", with(5, 0), "unknown kind 0"},
		{"bad dtype", with(6, 7), "unknown dtype 7"},
		{"rank too big", with(7, 9), "rank 9 exceeds 8"},
		{"wrong length", append(header(1, 1, 2, 2, 3), make([]byte, 100)...), "tensor message: payload is 100 bytes, shape [2 3] float32 needs 24"},
		{"negative dim", append(header(1, 1, 1, math.MaxUint64), make([]byte, 8)...), "out of range"},
		{"huge dim", header(1, 1, 1, 1<<62), "out of range"},
		{"overflowing shape", header(1, 2, 3, 1<<31, 1<<31, 1<<31), "too large"},
		{"huge shape, small payload", append(header(2, 1, 2, 1<<20, 1<<20), make([]byte, 16)...), "payload is 16 bytes, shape [1048576 1048576] float32 needs 4398046511104"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var x Tensor
			err := x.UnmarshalBinary(c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "tensor message: ") {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	// Encoding refuses the same things.
	bad := []*Tensor{
		{Kind: 3, DType: Float32},
		{Kind: Activation, DType: 0},
		{Kind: Activation, DType: Float32, Shape: []int{-1}},
		{Kind: Activation, DType: Float32, Shape: make([]int, 9)},
		{Kind: Activation, DType: Float32, Shape: []int{2}, Data: make([]byte, 4)},
	}
	for _, x := range bad {
		if _, err := x.MarshalBinary(); err == nil {
			t.Errorf("MarshalBinary accepted %+v", x)
		}
	}
	// A huge claimed shape must not make the decoder allocate.
	huge := header(1, 1, 2, 1<<20, 1<<20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		var x Tensor
		_ = x.UnmarshalBinary(huge)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 100<<10 {
		t.Errorf("100 decodes of a huge shape allocated %d bytes", n)
	}
}

func FuzzTensorUnmarshal(f *testing.F) {
	for _, x := range []*Tensor{
		{Kind: Activation, DType: Float32, Shape: []int{2, 3}, Data: make([]byte, 24)},
		{Kind: Gradient, Step: 9, MicroBatch: 2, DType: Float64, Data: make([]byte, 8)},
		{Kind: Gradient, DType: Float64, Shape: []int{0, 7}},
	} {
		b, err := x.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("PTT\x00\x01\x01\x01\x08"))
	f.Add(header(1, 1, 1, 1<<62))
	f.Fuzz(func(t *testing.T, b []byte) {
		var x Tensor
		if err := x.UnmarshalBinary(b); err != nil {
			return
		}
		out, err := x.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted %x but cannot re-marshal: %v", b, err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("re-marshal differs:\n in %x\nout %x", b, out)
		}
	})
}

// TestWrapSharesFromCopies: Wrap and From encode the same bytes; From's tensor
// owns a copy (the caller may reuse vals), Wrap's is vals' memory.
func TestWrapSharesFromCopies(t *testing.T) {
	f32 := []float32{1, -2, 3.5, float32(math.Inf(1)), 0, 6}
	f64 := []float64{1, -2, 3.5, math.Inf(-1), 0, 6e300}
	from32, err := FromFloat32s(Activation, 7, 3, []int{2, 3}, f32)
	if err != nil {
		t.Fatal(err)
	}
	wrap32, err := WrapFloat32s(Activation, 7, 3, []int{2, 3}, f32)
	if err != nil {
		t.Fatal(err)
	}
	from64, err := FromFloat64s(Gradient, 7, 3, []int{3, 2}, f64)
	if err != nil {
		t.Fatal(err)
	}
	wrap64, err := WrapFloat64s(Gradient, 7, 3, []int{3, 2}, f64)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]*Tensor{{from32, wrap32}, {from64, wrap64}} {
		a, _ := p[0].MarshalBinary()
		b, _ := p[1].MarshalBinary()
		if string(a) != string(b) {
			t.Fatalf("%s: Wrap encodes differently from From", p[0].DType)
		}
	}
	f32[0], f64[0] = 9, 9
	if from32.Float32s()[0] != 1 || from64.Float64s()[0] != 1 {
		t.Error("From's tensor shares the caller's memory")
	}
	if nativeLittle && (wrap32.Float32s()[0] != 9 || wrap64.Float64s()[0] != 9) {
		t.Error("Wrap's tensor copied the values")
	}
	if _, err := WrapFloat32s(Activation, 0, 0, []int{2, 2}, []float32{1}); err == nil {
		t.Error("Wrap accepted values that do not fill the shape")
	}
}
