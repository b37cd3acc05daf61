package transport

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestHalfRoundTrip: every 16-bit value decodes to a float32 that encodes back
// to it (NaNs stay NaNs).
func TestHalfRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name string
		enc  func(float32) uint16
		dec  func(uint16) float32
	}{{"float16", toFloat16, fromFloat16}, {"float16 fast path", toFloat16Fast, fromFloat16}, {"bfloat16", toBFloat16, fromBFloat16}} {
		for h := 0; h < 1<<16; h++ {
			f := c.dec(uint16(h))
			back := c.enc(f)
			if f != f {
				if g := c.dec(back); g == g {
					t.Fatalf("%s %#04x: NaN came back as %v", c.name, h, g)
				}
				continue
			}
			if back != uint16(h) {
				t.Fatalf("%s %#04x -> %v -> %#04x", c.name, h, f, back)
			}
		}
	}
}

// TestHalfRoundsToNearestEven checks random float32s of every magnitude against
// their neighbours in the 16-bit format.
func TestHalfRoundsToNearestEven(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		name string
		enc  func(float32) uint16
		dec  func(uint16) float32
		max  float64
	}{{"float16", toFloat16, fromFloat16, 65504}, {"float16 fast path", toFloat16Fast, fromFloat16, 65504}, {"bfloat16", toBFloat16, fromBFloat16, math.MaxFloat32}} {
		for i := 0; i < 200000; i++ {
			f := float32(math.Ldexp(r.Float64()*2-1, r.IntN(60)-40))
			if i%1000 == 0 {
				f = float32(i/1000) + 0.5 // exact ties
			}
			h := c.enc(f)
			got := float64(c.dec(h))
			if math.Abs(float64(f)) > c.max {
				continue
			}
			for _, n := range []uint16{h - 1, h + 1} {
				other := float64(c.dec(n))
				if math.IsNaN(other) || math.IsInf(other, 0) || math.Signbit(other) != math.Signbit(got) && got != 0 {
					continue
				}
				d, dn := math.Abs(got-float64(f)), math.Abs(other-float64(f))
				if dn < d || (dn == d && h&1 == 1) {
					t.Fatalf("%s(%v) = %#04x (%v); %#04x (%v) is nearer or the even tie", c.name, f, h, got, n, other)
				}
			}
		}
	}
	if got := fromFloat16(toFloat16(1e6)); !math.IsInf(float64(got), 1) {
		t.Errorf("float16(1e6) = %v, want +Inf", got)
	}
	if got := fromFloat16(toFloat16(-1e-9)); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("float16(-1e-9) = %v, want -0", got)
	}
}

func TestCompressedTensor(t *testing.T) {
	vals := []float32{1, -2.5, 3.14159, 1e-3, 65519}
	for _, dt := range []DType{BFloat16, Float16} {
		x, err := FromFloat32sAs(dt, Activation, 3, 1, []int{5}, vals)
		if err != nil {
			t.Fatal(err)
		}
		if len(x.Data) != 10 {
			t.Errorf("%s: %d bytes for 5 values", dt, len(x.Data))
		}
		b, err := x.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var y Tensor
		if err := y.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		got := y.AsFloat32s()
		for i, v := range vals[:4] {
			if rel := math.Abs(float64(got[i]-v)) / math.Abs(float64(v)); rel > 1.0/128 {
				t.Errorf("%s: %v came back as %v", dt, v, got[i])
			}
		}
	}
	if _, err := WireDType(Float64, "bf16"); err == nil {
		t.Error("bf16 accepted for a float64 model")
	}
	if _, err := WireDType(Float32, "int8"); err == nil {
		t.Error("unknown compression accepted")
	}
}

// TestEncodeLoopMatchesScalar: the tensor encoder's inlined fast path gives the
// same bits as the scalar conversion, across magnitudes.
func TestEncodeLoopMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	vals := make([]float32, 50000)
	for i := range vals {
		vals[i] = float32(math.Ldexp(r.Float64()*2-1, r.IntN(50)-30))
	}
	vals = append(vals, 0, float32(math.Inf(1)), float32(math.NaN()), 65504, 65520, 6.1e-5, 5.96e-8)
	x, err := FromFloat32sAs(Float16, Gradient, 0, 0, []int{len(vals)}, vals)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vals {
		if got, want := uint16(x.Data[2*i])|uint16(x.Data[2*i+1])<<8, toFloat16(v); got != want {
			t.Fatalf("%v: encoded %#04x, scalar %#04x", v, got, want)
		}
	}
}
