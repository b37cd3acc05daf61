//go:build amd64 && !nosimd

#include "textflag.h"

// The float32 loops of fastmath.go and fused.go, eight lanes at a time. Each
// lane runs the Go code's IEEE operations in its order: a multiply and an add
// where Go has them, never a fused multiply-add (the Go compiler fuses none
// for the amd64 baseline; built with GOAMD64=v3 it fuses the Go loops', which
// then differ from these in the last bit), and the same comparisons for
// exp's and tanh's special cases. The constants are the Go constants'
// float32 bits.

#define VEC8(name, bits) \
	DATA name+0(SB)/4, $bits; DATA name+4(SB)/4, $bits; DATA name+8(SB)/4, $bits; DATA name+12(SB)/4, $bits; \
	DATA name+16(SB)/4, $bits; DATA name+20(SB)/4, $bits; DATA name+24(SB)/4, $bits; DATA name+28(SB)/4, $bits; \
	GLOBL name(SB), RODATA|NOPTR, $32

VEC8(expHi<>, 0x42b17217)    // 88.72283
VEC8(expLo<>, 0xc2aeac4f)    // -87.33654
VEC8(log2e<>, 0x3fb8aa3b)    // 1.44269504088896341
VEC8(ln2Hi<>, 0x3f318000)    // 0.693359375
VEC8(ln2Lo<>, 0xb95e8083)    // -2.12194440e-4
VEC8(expC0<>, 0x39506967)    // 1.9875691500e-4
VEC8(expC1<>, 0x3ab743ce)    // 1.3981999507e-3
VEC8(expC2<>, 0x3c088908)    // 8.3334519073e-3
VEC8(expC3<>, 0x3d2aa9c1)    // 4.1665795894e-2
VEC8(expC4<>, 0x3e2aaaaa)    // 1.6666665459e-1
VEC8(expC5<>, 0x3f000000)    // 5.0000001201e-1
VEC8(roundMagic<>, 0x4b400000) // 1.5·2^23
VEC8(int127<>, 0x0000007f)
VEC8(one<>, 0x3f800000)
VEC8(two<>, 0x40000000)
VEC8(minusOne<>, 0xbf800000)
VEC8(half<>, 0x3f000000)
VEC8(nine<>, 0x41100000)
VEC8(minusNine<>, 0xc1100000)
VEC8(posInf<>, 0x7f800000)
VEC8(signBit<>, 0x80000000)

// masks<>+32-4r is r lanes of ones, then zeros: the valid lanes of a
// block of r < 8.
DATA masks<>+0(SB)/8, $-1
DATA masks<>+8(SB)/8, $-1
DATA masks<>+16(SB)/8, $-1
DATA masks<>+24(SB)/8, $-1
DATA masks<>+32(SB)/8, $0
DATA masks<>+40(SB)/8, $0
DATA masks<>+48(SB)/8, $0
DATA masks<>+56(SB)/8, $0
GLOBL masks<>(SB), RODATA|NOPTR, $64

// EXP8 sets y to exp32 of each lane of x, keeping x; k, n and r are
// clobbered. As exp32: t = x·log2e + magic; n = t − magic; k = bits(t) −
// bits(magic); r = (x − n·ln2Hi) − n·ln2Lo; the polynomial in r; then 2^k,
// as 2·2^127 where k is 128; then +Inf above expHi, 0 below expLo, and x
// itself where it is NaN.
#define EXP8(x, y, k, n, r) \
	VMULPS    log2e<>(SB), x, k; \
	VADDPS    roundMagic<>(SB), k, k; \
	VSUBPS    roundMagic<>(SB), k, n; \
	VPSUBD    roundMagic<>(SB), k, k; \
	VMULPS    ln2Hi<>(SB), n, r; \
	VSUBPS    r, x, r; \
	VMULPS    ln2Lo<>(SB), n, n; \
	VSUBPS    n, r, r; \
	VMULPS    expC0<>(SB), r, y; \
	VADDPS    expC1<>(SB), y, y; \
	VMULPS    r, y, y; \
	VADDPS    expC2<>(SB), y, y; \
	VMULPS    r, y, y; \
	VADDPS    expC3<>(SB), y, y; \
	VMULPS    r, y, y; \
	VADDPS    expC4<>(SB), y, y; \
	VMULPS    r, y, y; \
	VADDPS    expC5<>(SB), y, y; \
	VMULPS    r, y, y; \
	VMULPS    r, y, y; \
	VADDPS    r, y, y; \
	VADDPS    one<>(SB), y, y; \
	VPCMPGTD  int127<>(SB), k, n; \
	VPMINSD   int127<>(SB), k, k; \
	VANDPS    one<>(SB), n, n; \
	VADDPS    one<>(SB), n, n; \
	VMULPS    n, y, y; \
	VPADDD    int127<>(SB), k, k; \
	VPSLLD    $23, k, k; \
	VMULPS    k, y, y; \
	VCMPPS    $0x1e, expHi<>(SB), x, n; \
	VBLENDVPS n, posInf<>(SB), y, y; \
	VCMPPS    $0x11, expLo<>(SB), x, n; \
	VXORPS    r, r, r; \
	VBLENDVPS n, r, y, y; \
	VCMPPS    $0x03, x, x, n; \
	VBLENDVPS n, x, y, y

// TANH8 sets y to tanh32 of each lane of x, keeping x: 1 − 2/(exp32(2·x) +
// 1), then 1 above 9 and −1 below −9; a, k, n and r are clobbered.
#define TANH8(x, y, a, k, n, r) \
	VMULPS    two<>(SB), x, a; \
	EXP8(a, y, k, n, r); \
	VADDPS    one<>(SB), y, y; \
	VMOVUPS   two<>(SB), a; \
	VDIVPS    y, a, a; \
	VMOVUPS   one<>(SB), y; \
	VSUBPS    a, y, y; \
	VCMPPS    $0x1e, nine<>(SB), x, n; \
	VBLENDVPS n, one<>(SB), y, y; \
	VCMPPS    $0x11, minusNine<>(SB), x, n; \
	VBLENDVPS n, minusOne<>(SB), y, y

// GELUARG8 sets u = c·(v + k·v·v·v), GELU's argument of tanh.
#define GELUARG8(v, c, k, u) \
	VMULPS v, k, u; \
	VMULPS v, u, u; \
	VMULPS v, u, u; \
	VADDPS u, v, u; \
	VMULPS u, c, u

// func expAVX2(dst, src *float32, n int)
TEXT ·expAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   expDone

expLoop:
	VMOVUPS (SI), Y0
	EXP8(Y0, Y1, Y2, Y3, Y4)
	VMOVUPS Y1, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     expLoop

expDone:
	VZEROUPPER
	RET

// func tanhAVX2(dst, src *float32, n int)
TEXT ·tanhAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   tanhDone

tanhLoop:
	VMOVUPS (SI), Y0
	TANH8(Y0, Y1, Y2, Y3, Y4, Y5)
	VMOVUPS Y1, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     tanhLoop

tanhDone:
	VZEROUPPER
	RET

// func geluAVX2(out, x *float32, n int, c, k float32)
//
// out = (0.5·v)·(1 + t), t = tanh32(c·(v + k·v·v·v)).
TEXT ·geluAVX2(SB), NOSPLIT, $0-32
	MOVQ         out+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS c+24(FP), Y14
	VBROADCASTSS k+28(FP), Y15
	SHRQ         $3, CX
	JZ           geluDone

geluLoop:
	VMOVUPS (SI), Y0
	GELUARG8(Y0, Y14, Y15, Y1)
	TANH8(Y1, Y2, Y3, Y4, Y5, Y6)
	VMULPS  half<>(SB), Y0, Y3
	VADDPS  one<>(SB), Y2, Y2
	VMULPS  Y2, Y3, Y3
	VMOVUPS Y3, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     geluLoop

geluDone:
	VZEROUPPER
	RET

// func geluGradAVX2(out, x, dy *float32, n int, c, k, k3 float32)
//
// out = (0.5·(1 + t) + ((0.5·v)·(1 − t·t))·c·(1 + k3·v·v))·dy.
TEXT ·geluGradAVX2(SB), NOSPLIT, $0-44
	MOVQ         out+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         dy+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS c+32(FP), Y13
	VBROADCASTSS k+36(FP), Y14
	VBROADCASTSS k3+40(FP), Y15
	SHRQ         $3, CX
	JZ           geluGradDone

geluGradLoop:
	VMOVUPS (SI), Y0
	GELUARG8(Y0, Y13, Y14, Y1)
	TANH8(Y1, Y2, Y3, Y4, Y5, Y6)
	VADDPS  one<>(SB), Y2, Y7  // 1 + t
	VMULPS  half<>(SB), Y7, Y7 // 0.5·(1 + t)
	VMULPS  half<>(SB), Y0, Y8 // 0.5·v
	VMULPS  Y2, Y2, Y9         // t·t
	VMOVUPS one<>(SB), Y10
	VSUBPS  Y9, Y10, Y10       // 1 − t·t
	VMULPS  Y10, Y8, Y8
	VMULPS  Y13, Y8, Y8        // ·c
	VMULPS  Y0, Y15, Y9        // k3·v
	VMULPS  Y0, Y9, Y9         // ·v
	VADDPS  one<>(SB), Y9, Y9  // 1 + k3·v·v
	VMULPS  Y9, Y8, Y8
	VADDPS  Y8, Y7, Y7
	VMULPS  (DX), Y7, Y7       // (…)·dy, the compiled Go loop's order
	VMOVUPS Y7, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     geluGradLoop

geluGradDone:
	VZEROUPPER
	RET

// func addRowsAVX(out, x, b *float32, n, d int)
//
// out[r·d+j] = x[r·d+j] + b[j] over n rows of d.
TEXT ·addRowsAVX(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+24(FP), R8
	MOVQ d+32(FP), R9
	TESTQ R8, R8
	JZ   addRowsDone

addRowsRow:
	MOVQ b+16(FP), DX
	MOVQ R9, CX
	SHRQ $3, CX
	JZ   addRowsTail

addRowsLoop:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     addRowsLoop

addRowsTail:
	MOVQ R9, CX
	ANDQ $7, CX
	JZ   addRowsNext

addRowsOne:
	VMOVSS (SI), X0
	VADDSS (DX), X0, X0
	VMOVSS X0, (DI)
	ADDQ   $4, SI
	ADDQ   $4, DX
	ADDQ   $4, DI
	DECQ   CX
	JNZ    addRowsOne

addRowsNext:
	DECQ R8
	JNZ  addRowsRow

addRowsDone:
	VZEROUPPER
	RET

// func colSumAVX(out, x *float32, n, d int)
//
// out[j] = Σ x[r·d+j], starting from 0 and adding row after row. The sum is
// x's value plus out's, in that order, as the compiled Go loop has it (the
// order decides which NaN comes out of two).
TEXT ·colSumAVX(SB), NOSPLIT, $0-32
	MOVQ   out+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   n+16(FP), R8
	MOVQ   d+24(FP), R9
	VXORPS Y1, Y1, Y1
	MOVQ   DI, DX
	MOVQ   R9, CX
	SHRQ   $3, CX
	JZ     colSumClearTail

colSumClear:
	VMOVUPS Y1, (DX)
	ADDQ    $32, DX
	DECQ    CX
	JNZ     colSumClear

colSumClearTail:
	MOVQ R9, CX
	ANDQ $7, CX
	JZ   colSumRows

colSumClearOne:
	MOVL $0, (DX)
	ADDQ $4, DX
	DECQ CX
	JNZ  colSumClearOne

colSumRows:
	TESTQ R8, R8
	JZ    colSumDone

colSumRow:
	MOVQ DI, DX
	MOVQ R9, CX
	SHRQ $3, CX
	JZ   colSumTail

colSumLoop:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DX)
	ADDQ    $32, SI
	ADDQ    $32, DX
	DECQ    CX
	JNZ     colSumLoop

colSumTail:
	MOVQ R9, CX
	ANDQ $7, CX
	JZ   colSumNext

colSumOne:
	VMOVSS (SI), X0
	VADDSS (DX), X0, X0
	VMOVSS X0, (DX)
	ADDQ   $4, SI
	ADDQ   $4, DX
	DECQ   CX
	JNZ    colSumOne

colSumNext:
	DECQ R8
	JNZ  colSumRow

colSumDone:
	VZEROUPPER
	RET

// GOMIN sets a to Go's min(a, b) on each lane: MIN(MIN(a, b), a) | MIN(a,
// b), MIN being the instruction's a < b ? a : b, which is how the Go
// compiler lowers min on amd64 (and max(x, y) as −min(−x, −y)). On
// numbers it is the minimum with −0 below +0, whatever the order; a NaN
// in either gives a NaN. t and u are clobbered.
#define GOMIN(a, b, t, u) \
	VMINPS b, a, t; \
	VMINPS a, t, u; \
	VORPS  t, u, a

// func causalSoftmaxAVX2(p *float32, t, ld int)
//
// causalSoftmaxGo on t rows of t, ld apart, row by row: the row's maximum m over j <=
// i; exp32(row[j] − m) for j <= i, and 0 (exp32 of the −Inf mask) after;
// the four running sums of sum over j <= i, then (s0 + s1) + (s2 + s3);
// row[j]·(1/sum). The maximum is taken eight lanes at a time as −min of the
// negated row, which is the sequential max's value wherever the row has
// no NaN; with a NaN, whose bits depend on the order, the row is taken
// again one value at a time as the Go loop does.
//
// Registers: DI the row, R8 t, R9 i, R10 i+1 (the row's length L), BX 4ld,
// Y12 the mask of L's last L mod 8 lanes, Y13 m, Y14 +Inf, Y15 the sign bit.
TEXT ·causalSoftmaxAVX2(SB), NOSPLIT, $0-24
	MOVQ    p+0(FP), DI
	MOVQ    t+8(FP), R8
	MOVQ    ld+16(FP), BX
	TESTQ   R8, R8
	JZ      smDone
	SHLQ    $2, BX
	XORQ    R9, R9
	VMOVUPS posInf<>(SB), Y14
	VMOVUPS signBit<>(SB), Y15

smRow:
	LEAQ 1(R9), R10

	// The mask of the last L mod 8 lanes (unused where L is a multiple
	// of 8).
	MOVQ    R10, AX
	ANDQ    $7, AX
	SHLQ    $2, AX
	LEAQ    masks<>+32(SB), DX
	SUBQ    AX, DX
	VMOVUPS (DX), Y12

	// Y7 = −max, eight lanes, from +Inf (−(−Inf)).
	VMOVUPS Y14, Y7
	MOVQ    DI, SI
	MOVQ    R10, CX
	SHRQ    $3, CX
	JZ      smMaxPart

smMaxLoop:
	VXORPS (SI), Y15, Y0
	GOMIN(Y7, Y0, Y1, Y2)
	ADDQ   $32, SI
	DECQ   CX
	JNZ    smMaxLoop

smMaxPart:
	TESTQ      $7, R10
	JZ         smMaxReduce
	VMASKMOVPS (SI), Y12, Y0
	VXORPS     Y15, Y0, Y0
	VBLENDVPS  Y12, Y0, Y14, Y0
	GOMIN(Y7, Y0, Y1, Y2)

smMaxReduce:
	VEXTRACTF128 $1, Y7, X0
	GOMIN(X7, X0, X1, X2)
	VMOVHLPS     X7, X7, X0
	GOMIN(X7, X0, X1, X2)
	VMOVSHDUP    X7, X0
	GOMIN(X7, X0, X1, X2)
	VUCOMISS     X7, X7
	JPS          smMaxScalar
	VXORPS       X15, X7, X7
	JMP          smHaveMax

	// m = row[0], then m = max(m, row[j]) as the Go compiler lowers it:
	// −min(−m, −row[j]), the running value kept negated in between.
smMaxScalar:
	VMOVSS (DI), X7
	MOVQ   R9, CX
	LEAQ   4(DI), SI
	TESTQ  CX, CX
	JZ     smHaveMax

smMaxOne:
	VXORPS X15, X7, X1
	VMOVSS (SI), X2
	VXORPS X15, X2, X2
	VMINSS X2, X1, X3
	VMINSS X1, X3, X4
	VORPS  X3, X4, X7
	VXORPS X15, X7, X7
	ADDQ   $4, SI
	DECQ   CX
	JNZ    smMaxOne

smHaveMax:
	VBROADCASTSS X7, Y13

	// row[j] = exp32(row[j] − m) for j < L.
	MOVQ DI, SI
	MOVQ R10, CX
	SHRQ $3, CX
	JZ   smExpPart

smExpLoop:
	VMOVUPS (SI), Y0
	VSUBPS  Y13, Y0, Y0
	EXP8(Y0, Y1, Y2, Y3, Y4)
	VMOVUPS Y1, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     smExpLoop

smExpPart:
	TESTQ      $7, R10
	JZ         smSum
	VMASKMOVPS (SI), Y12, Y0
	VSUBPS     Y13, Y0, Y0
	EXP8(Y0, Y1, Y2, Y3, Y4)
	VMASKMOVPS Y1, Y12, (SI)

	// sum: s0..s3 in X8's lanes, four values at a time, the rest into s0.
smSum:
	VXORPS X8, X8, X8
	MOVQ   DI, SI
	MOVQ   R10, CX
	SHRQ   $2, CX
	JZ     smSumTail

smSumLoop:
	VADDPS (SI), X8, X8
	ADDQ   $16, SI
	DECQ   CX
	JNZ    smSumLoop

smSumTail:
	MOVQ R10, CX
	ANDQ $3, CX
	JZ   smSumDone

smSumOne:
	VADDSS (SI), X8, X8
	ADDQ   $4, SI
	DECQ   CX
	JNZ    smSumOne

smSumDone:
	VMOVSHDUP    X8, X9
	VADDPS       X9, X8, X9
	VMOVHLPS     X9, X9, X10
	VADDSS       X10, X9, X9
	VMOVSS       one<>(SB), X10
	VDIVSS       X9, X10, X10
	VBROADCASTSS X10, Y10

	// row[j] *= 1/sum for j < L.
	MOVQ DI, SI
	MOVQ R10, CX
	SHRQ $3, CX
	JZ   smScaleTail

smScaleLoop:
	VMOVUPS (SI), Y0
	VMULPS  Y10, Y0, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     smScaleLoop

smScaleTail:
	MOVQ R10, CX
	ANDQ $7, CX
	JZ   smZero

smScaleOne:
	VMOVSS (SI), X0
	VMULSS X10, X0, X0
	VMOVSS X0, (SI)
	ADDQ   $4, SI
	DECQ   CX
	JNZ    smScaleOne

	// row[j] = 0 for L <= j < t.
smZero:
	LEAQ   (DI)(R10*4), SI
	MOVQ   R8, CX
	SUBQ   R10, CX
	JZ     smNext
	VXORPS Y0, Y0, Y0
	MOVQ   CX, DX
	SHRQ   $3, CX
	JZ     smZeroTail

smZeroLoop:
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     smZeroLoop

smZeroTail:
	ANDQ $7, DX
	JZ   smNext

smZeroOne:
	MOVL $0, (SI)
	ADDQ $4, SI
	DECQ DX
	JNZ  smZeroOne

smNext:
	ADDQ BX, DI
	MOVQ R10, R9
	CMPQ R9, R8
	JB   smRow

smDone:
	VZEROUPPER
	RET

// func swigluAVX2(out, gate, up *float32, n int)
//
// out = gate/(1 + exp32(−gate))·up, SwiGLU's forward. In this kernel and the
// two gradients each operation takes its operands in the order the compiled
// Go loop does (which decides the NaN that comes out of two).
TEXT ·swigluAVX2(SB), NOSPLIT, $0-32
	MOVQ    out+0(FP), DI
	MOVQ    gate+8(FP), SI
	MOVQ    up+16(FP), DX
	MOVQ    n+24(FP), CX
	VMOVUPS signBit<>(SB), Y15
	SHRQ    $3, CX
	JZ      swigluDone

swigluLoop:
	VMOVUPS (SI), Y0
	VXORPS  Y15, Y0, Y5
	EXP8(Y5, Y1, Y2, Y3, Y4)
	VADDPS  one<>(SB), Y1, Y1 // 1 + e
	VDIVPS  Y1, Y0, Y6        // gate/(1 + e)
	VMULPS  (DX), Y6, Y6      // ·up
	VMOVUPS Y6, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     swigluLoop

swigluDone:
	VZEROUPPER
	RET

// func swigluGateGradAVX2(out, gate, up, dy *float32, n int)
//
// out = dy·up·s·(1 + gate·(1 − s)), s = 1/(1 + exp32(−gate)).
TEXT ·swigluGateGradAVX2(SB), NOSPLIT, $0-40
	MOVQ    out+0(FP), DI
	MOVQ    gate+8(FP), SI
	MOVQ    up+16(FP), DX
	MOVQ    dy+24(FP), R8
	MOVQ    n+32(FP), CX
	VMOVUPS signBit<>(SB), Y15
	VMOVUPS one<>(SB), Y14
	SHRQ    $3, CX
	JZ      swigluGateGradDone

swigluGateGradLoop:
	VMOVUPS (SI), Y0
	VXORPS  Y15, Y0, Y5
	EXP8(Y5, Y1, Y2, Y3, Y4)
	VADDPS  Y14, Y1, Y1  // 1 + e
	VDIVPS  Y1, Y14, Y1  // s
	VMOVUPS (R8), Y6
	VMULPS  (DX), Y6, Y6 // dy·up
	VMULPS  Y1, Y6, Y6   // ·s
	VSUBPS  Y1, Y14, Y7  // 1 − s
	VMULPS  Y0, Y7, Y7   // gate·(1 − s), (1 − s) first as compiled
	VADDPS  Y14, Y7, Y7  // 1 + …
	VMULPS  Y6, Y7, Y6   // the compiled loop's order again
	VMOVUPS Y6, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, DI
	DECQ    CX
	JNZ     swigluGateGradLoop

swigluGateGradDone:
	VZEROUPPER
	RET

// func swigluUpGradAVX2(out, gate, dy *float32, n int)
//
// out = dy·gate/(1 + exp32(−gate)).
TEXT ·swigluUpGradAVX2(SB), NOSPLIT, $0-32
	MOVQ    out+0(FP), DI
	MOVQ    gate+8(FP), SI
	MOVQ    dy+16(FP), DX
	MOVQ    n+24(FP), CX
	VMOVUPS signBit<>(SB), Y15
	SHRQ    $3, CX
	JZ      swigluUpGradDone

swigluUpGradLoop:
	VMOVUPS (SI), Y0
	VXORPS  Y15, Y0, Y5
	EXP8(Y5, Y1, Y2, Y3, Y4)
	VADDPS  one<>(SB), Y1, Y1 // 1 + e
	VMOVUPS (DX), Y6
	VMULPS  Y0, Y6, Y6        // dy·gate
	VDIVPS  Y1, Y6, Y6        // /(1 + e)
	VMOVUPS Y6, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     swigluUpGradLoop

swigluUpGradDone:
	VZEROUPPER
	RET

// func rmsScaleRowAVX(out, x, gain *float32, n int, rstd float32)
//
// out = x·rstd·gain, a row of RMSNorm. This kernel, the two gradients' and
// the rotary one take each operation's operands in the order of the
// compiled Go loop, as the SwiGLU kernels do.
TEXT ·rmsScaleRowAVX(SB), NOSPLIT, $0-36
	MOVQ         out+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         gain+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS rstd+32(FP), Y15
	SHRQ         $3, CX
	JZ           rmsScaleDone

rmsScaleLoop:
	VMOVUPS (SI), Y0
	VMULPS  Y15, Y0, Y0
	VMULPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     rmsScaleLoop

rmsScaleDone:
	VZEROUPPER
	RET

// func rmsInputGradRowAVX(out, x, dy, gain *float32, n int, rstd, mgx float32)
//
// out = rstd·(dy·gain − x·rstd·mgx).
TEXT ·rmsInputGradRowAVX(SB), NOSPLIT, $0-48
	MOVQ         out+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         dy+16(FP), DX
	MOVQ         gain+24(FP), R8
	MOVQ         n+32(FP), CX
	VBROADCASTSS rstd+40(FP), Y15
	VBROADCASTSS mgx+44(FP), Y14
	SHRQ         $3, CX
	JZ           rmsInputGradDone

rmsInputGradLoop:
	VMOVUPS (DX), Y0
	VMULPS  (R8), Y0, Y0 // dy·gain
	VMOVUPS (SI), Y1
	VMULPS  Y15, Y1, Y1  // x·rstd
	VMULPS  Y14, Y1, Y1  // ·mgx
	VSUBPS  Y1, Y0, Y0
	VMULPS  Y15, Y0, Y0  // rstd·(…), (…) first as compiled
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, DI
	DECQ    CX
	JNZ     rmsInputGradLoop

rmsInputGradDone:
	VZEROUPPER
	RET

// func rmsGainGradRowAVX(out, x, dy *float32, n int, rstd float32)
//
// out += dy·x·rstd.
TEXT ·rmsGainGradRowAVX(SB), NOSPLIT, $0-36
	MOVQ         out+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         dy+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS rstd+32(FP), Y15
	SHRQ         $3, CX
	JZ           rmsGainGradDone

rmsGainGradLoop:
	VMOVUPS (DX), Y0
	VMULPS  (SI), Y0, Y0 // dy·x
	VMULPS  Y15, Y0, Y0  // ·rstd
	VADDPS  (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     rmsGainGradLoop

rmsGainGradDone:
	VZEROUPPER
	RET

// func ropeRowAVX(o1, o2, x1, x2, c, sn *float32, n int)
//
// o1 = x1·c − x2·sn; o2 = x2·c + x1·sn. Where two NaNs meet, which one comes
// out is the only difference from the Go loop, whose compiled operand order
// here changes from one place it is inlined to another.
TEXT ·ropeRowAVX(SB), NOSPLIT, $0-56
	MOVQ o1+0(FP), DI
	MOVQ o2+8(FP), R9
	MOVQ x1+16(FP), SI
	MOVQ x2+24(FP), DX
	MOVQ c+32(FP), R8
	MOVQ sn+40(FP), R10
	MOVQ n+48(FP), CX
	SHRQ $3, CX
	JZ   ropeDone

ropeLoop:
	VMOVUPS (SI), Y0    // x1
	VMOVUPS (DX), Y1    // x2
	VMOVUPS (R8), Y2    // c
	VMOVUPS (R10), Y3   // sn
	VMULPS  Y0, Y2, Y4  // x1·c
	VMULPS  Y1, Y3, Y5  // x2·sn
	VSUBPS  Y5, Y4, Y4
	VMOVUPS Y4, (DI)
	VMULPS  Y1, Y2, Y4  // x2·c
	VMULPS  Y0, Y3, Y5  // x1·sn
	VADDPS  Y5, Y4, Y4
	VMOVUPS Y4, (R9)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, R10
	ADDQ    $32, DI
	ADDQ    $32, R9
	DECQ    CX
	JNZ     ropeLoop

ropeDone:
	VZEROUPPER
	RET
