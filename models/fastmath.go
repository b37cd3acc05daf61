package models

import "math"

// Float32 exp and tanh for the fused ops' inner loops. chewxy/math32 (what
// gorgonia's element-wise ops call) ports the float64 algorithms with their
// special-case checks and took a third of a GPT step in exp and tanh; these
// are Cephes' single-precision expf (range reduction by ln 2, a degree-6
// polynomial, the exponent set by bits), within 2 ulp of the true value,
// and tanh through it. Every process of a run calls the same code, so
// pipelined runs stay bit-identical to the reference.

const (
	expHi    = 88.72283  // above: +Inf
	expLo    = -87.33654 // below: 0 (the smallest normal float32 is e^-87.34)
	log2e    = 1.44269504088896341
	ln2Hi    = 0.693359375
	ln2Lo    = -2.12194440e-4
	expCoef0 = 1.9875691500e-4
	expCoef1 = 1.3981999507e-3
	expCoef2 = 8.3334519073e-3
	expCoef3 = 4.1665795894e-2
	expCoef4 = 1.6666665459e-1
	expCoef5 = 5.0000001201e-1

	roundMagic float32 = 12582912 // 1.5·2^23
)

// exp32 is e^x in float32.
func exp32(x float32) float32 {
	switch {
	case x != x: // NaN
		return x
	case x > expHi:
		return float32(math.Inf(1))
	case x < expLo:
		return 0
	}
	// n = round(x·log2 e): adding 1.5·2^23 leaves the integer part in the
	// low bits of the mantissa, rounded to nearest.
	t := x*log2e + roundMagic
	n := t - roundMagic
	k := int32(math.Float32bits(t)) - int32(math.Float32bits(roundMagic))
	r := x - n*ln2Hi - n*ln2Lo
	p := float32(expCoef0)
	p = p*r + expCoef1
	p = p*r + expCoef2
	p = p*r + expCoef3
	p = p*r + expCoef4
	p = p*r + expCoef5
	y := p*r*r + r + 1
	// k is within [-126, 128]: 2^k is a normal float32 except at 128, which
	// y < 1 needs when x is near the top; split it.
	if k > 127 {
		return y * 2 * math.Float32frombits(uint32(k-1+127)<<23)
	}
	return y * math.Float32frombits(uint32(k+127)<<23)
}

// tanh32 is tanh(x) in float32 as 1 − 2/(e^{2x} + 1): within 1e-7 of the
// true value absolutely (relatively less near 0, where GELU, its user,
// adds it to 1 anyway).
func tanh32(x float32) float32 {
	if x > 9 { // tanh is 1 in float32
		return 1
	}
	if x < -9 {
		return -1
	}
	return 1 - 2/(exp32(2*x)+1)
}

// sum is Σ v with four running sums, so the additions overlap instead of
// each waiting for the last (the rows LayerNorm and softmax reduce are
// short, and a single chain of dependent adds bounds them).
func sum[T float32 | float64](v []T) T {
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(v); i += 4 {
		s0 += v[i]
		s1 += v[i+1]
		s2 += v[i+2]
		s3 += v[i+3]
	}
	for ; i < len(v); i++ {
		s0 += v[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// dot is Σ a·b with four running sums, as sum.
func dot[T float32 | float64](a, b []T) T {
	b = b[:len(a)]
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// centredSquares is Σ (v − mean)² with four running sums, as sum.
func centredSquares[T float32 | float64](v []T, mean T) T {
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(v); i += 4 {
		c0, c1, c2, c3 := v[i]-mean, v[i+1]-mean, v[i+2]-mean, v[i+3]-mean
		s0 += c0 * c0
		s1 += c1 * c1
		s2 += c2 * c2
		s3 += c3 * c3
	}
	for ; i < len(v); i++ {
		c := v[i] - mean
		s0 += c * c
	}
	return (s0 + s1) + (s2 + s3)
}
