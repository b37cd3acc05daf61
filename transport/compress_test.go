package transport

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
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
	halves := make([]uint16, len(vals))
	encodeHalves(Float16, vals, halves)
	for i, v := range vals {
		if got, want := halves[i], toFloat16(v); got != want {
			t.Fatalf("%v: encoded %#04x, scalar %#04x", v, got, want)
		}
	}
}

// BenchmarkCast measures the link's casts of a 4 MiB float32 tensor (1 Mi
// values) to 16 bits and back; bytes/s counts the float32 side.
func BenchmarkCast(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	vals := make([]float32, 1<<20)
	for i := range vals {
		vals[i] = float32(r.NormFloat64())
	}
	for _, dt := range []DType{Float16, BFloat16} {
		b.Run("encode-"+dt.String(), func(b *testing.B) {
			b.SetBytes(4 << 20)
			for range b.N {
				if _, err := FromFloat32sAs(dt, Activation, 0, 0, []int{len(vals)}, vals); err != nil {
					b.Fatal(err)
				}
			}
		})
		x, err := FromFloat32sAs(dt, Activation, 0, 0, []int{len(vals)}, vals)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("decode-"+dt.String(), func(b *testing.B) {
			b.SetBytes(4 << 20)
			for range b.N {
				x.AsFloat32s()
			}
		})
		// What a stage does with a received tensor: widen into a pooled
		// buffer, use, release. The clone stands for the receive.
		b.Run("receive-widen-release-"+dt.String(), func(b *testing.B) {
			b.SetBytes(4 << 20)
			for range b.N {
				r := x.clone()
				if err := r.Widen(); err != nil {
					b.Fatal(err)
				}
				r.Release()
			}
		})
	}
}

// TestSIMDCastsMatchGo: the vector casts give the Go conversions' bits, NaNs
// included, for float32s of every sign and exponent with the mantissa patterns
// around each rounding boundary, and for every 16-bit value decoded; and so do
// their one-at-a-time tails, at every length and alignment of a tail.
func TestSIMDCastsMatchGo(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var vals []float32
	for sign := uint32(0); sign < 2; sign++ {
		for exp := uint32(0); exp < 256; exp++ {
			for top := uint32(0); top < 1024; top++ {
				for _, low := range []uint32{0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, r.Uint32() & 0x1fff} {
					vals = append(vals, math.Float32frombits(sign<<31|exp<<23|top<<13|low))
				}
			}
		}
	}
	all := make([]uint16, 1<<16)
	for h := range all {
		all[h] = uint16(h)
	}
	ran := false
	for _, c := range []struct {
		dt  DType
		enc func(float32) uint16
		dec func(uint16) float32
	}{{Float16, toFloat16, fromFloat16}, {BFloat16, toBFloat16, fromBFloat16}} {
		if !vectorCasts(c.dt) {
			t.Logf("%s: no vector casts in this build or on this CPU (%s)", c.dt, CastsUsed())
			continue
		}
		ran = true
		encode := func(vals []float32) {
			t.Helper()
			halves := make([]uint16, len(vals))
			if !encodeHalvesSIMD(c.dt, vals, halves) {
				t.Fatalf("%s: vector encode of %d values not taken", c.dt, len(vals))
			}
			for i, v := range vals {
				if want := c.enc(v); halves[i] != want {
					t.Fatalf("%s: %#08x (%d of %d) encoded %#04x, Go %#04x", c.dt, math.Float32bits(v), i, len(vals), halves[i], want)
				}
			}
		}
		decode := func(halves []uint16) {
			t.Helper()
			got := make([]float32, len(halves))
			if !decodeHalvesSIMD(c.dt, halves, got) {
				t.Fatalf("%s: vector decode of %d values not taken", c.dt, len(halves))
			}
			for i, g := range got {
				if want := c.dec(halves[i]); math.Float32bits(g) != math.Float32bits(want) {
					t.Fatalf("%s: %#04x (%d of %d) decoded %#08x, Go %#08x", c.dt, halves[i], i, len(halves), math.Float32bits(g), math.Float32bits(want))
				}
			}
		}
		encode(vals)
		decode(all)
		// Tails: zeros, subnormals, the edges of float16's range, infinities
		// and NaNs of both signs, from every start within a block of 8.
		for off := range 9 {
			for n := 1; n <= 25; n++ {
				for _, exp := range []int{0, 1, 102, 103, 112, 113, 142, 143, 254, 255} {
					for sign := range 2 {
						from := (sign*256+exp)*7*1024 + off
						encode(vals[from : from+n])
					}
				}
				for _, h := range []int{0, 0x0400, 0x7c00, 0x7f80, 0x8000, 0xfc00, 0xff80} {
					decode(all[h+off : h+off+n])
				}
			}
		}
	}
	if !ran {
		t.Skipf("this build or CPU has no vector casts (%s)", CastsUsed())
	}
}

// TestWiden: a received 16-bit tensor widens in place to the float32 values
// AsFloat32s gives, in memory that Release hands back (poisoned here).
func TestWiden(t *testing.T) {
	PoisonReleased(true)
	defer PoisonReleased(false)
	vals := make([]float32, 1000) // above the vector casts' threshold
	for i := range vals {
		vals[i] = float32(i)/7 - 50
	}
	for _, dt := range []DType{Float16, BFloat16} {
		sent, err := FromFloat32sAs(dt, Activation, 1, 2, []int{10, 100}, vals)
		if err != nil {
			t.Fatal(err)
		}
		want := sent.AsFloat32s()
		up, down := hellos(10, 100)
		up.DType, down.DType = dt, dt
		a, b := Pipe(up, down, 1)
		ctx := ctxT(t, 5*time.Second)
		if err := a.Send(ctx, sent); err != nil {
			t.Fatal(err)
		}
		got, err := b.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wire := got.Data
		if err := got.Widen(); err != nil {
			t.Fatal(err)
		}
		if got.DType != Float32 || len(got.Data) != 4*len(vals) {
			t.Fatalf("%s widened to %s with %d bytes", dt, got.DType, len(got.Data))
		}
		for i, v := range got.Float32s() {
			if v != want[i] {
				t.Fatalf("%s: value %d widened to %v, want %v", dt, i, v, want[i])
			}
		}
		if wire[0] != 0xff || wire[len(wire)-1] != 0xff {
			t.Errorf("%s: the 16-bit buffer was not handed back", dt)
		}
		mem := got.Data
		got.Release()
		if mem[0] != 0xff {
			t.Errorf("%s: Release did not hand back the widened buffer", dt)
		}
	}
	x := &Tensor{DType: Float64}
	if err := x.Widen(); err == nil {
		t.Error("widening a float64 tensor succeeded")
	}
}
