//go:build amd64 && !nosimd

#include "textflag.h"

// Eight parameters at a time. Each lane does the IEEE operations of
// update's Go loop in the same order, each rounded to float32, so the
// results are the same bits (multiplication and addition commute exactly;
// VSQRTPS is the correctly rounded square root the loop gets by rounding
// float64's).

// func sgdAVX(p, grad *float32, n int, lr float32)
//
// p -= lr·g; g = 0.
TEXT ·sgdAVX(SB), NOSPLIT, $0-28
	MOVQ         p+0(FP), DI
	MOVQ         grad+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS lr+24(FP), Y1
	VXORPS       Y3, Y3, Y3
	SHRQ         $3, CX
	JZ           sgdDone

sgdLoop:
	VMULPS  (SI), Y1, Y0
	VMOVUPS (DI), Y4
	VSUBPS  Y0, Y4, Y4
	VMOVUPS Y4, (DI)
	VMOVUPS Y3, (SI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	DECQ    CX
	JNZ     sgdLoop

sgdDone:
	VZEROUPPER
	RET

// func momentumAVX(p, grad, buf *float32, n int, lr, mu float32)
//
// buf = mu·buf + g; p -= lr·buf; g = 0.
TEXT ·momentumAVX(SB), NOSPLIT, $0-40
	MOVQ         p+0(FP), DI
	MOVQ         grad+8(FP), SI
	MOVQ         buf+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS lr+32(FP), Y1
	VBROADCASTSS mu+36(FP), Y2
	VXORPS       Y3, Y3, Y3
	SHRQ         $3, CX
	JZ           momentumDone

momentumLoop:
	VMULPS  (DX), Y2, Y0
	VADDPS  (SI), Y0, Y0
	VMOVUPS Y0, (DX)
	VMULPS  Y0, Y1, Y0
	VMOVUPS (DI), Y4
	VSUBPS  Y0, Y4, Y4
	VMOVUPS Y4, (DI)
	VMOVUPS Y3, (SI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	ADDQ    $32, DX
	DECQ    CX
	JNZ     momentumLoop

momentumDone:
	VZEROUPPER
	RET

// func adamAVX(p, grad, m, v *float32, n int, c *adamConsts)
//
// m = b1·m + (1−b1)·g; v = b2·v + ((1−b2)·g)·g;
// p -= (step·m) / (sqrt(v) + eps); g = 0.
TEXT ·adamAVX(SB), NOSPLIT, $0-48
	MOVQ         p+0(FP), DI
	MOVQ         grad+8(FP), SI
	MOVQ         m+16(FP), DX
	MOVQ         v+24(FP), R8
	MOVQ         n+32(FP), CX
	MOVQ         c+40(FP), AX
	VBROADCASTSS 0(AX), Y8  // b1
	VBROADCASTSS 4(AX), Y9  // 1 - b1
	VBROADCASTSS 8(AX), Y10 // b2
	VBROADCASTSS 12(AX), Y11 // 1 - b2
	VBROADCASTSS 16(AX), Y12 // step
	VBROADCASTSS 20(AX), Y13 // eps
	VXORPS       Y3, Y3, Y3
	SHRQ         $3, CX
	JZ           adamDone

adamLoop:
	VMOVUPS (SI), Y5          // g
	VMULPS  (DX), Y8, Y0      // b1·m
	VMULPS  Y5, Y9, Y1        // (1−b1)·g
	VADDPS  Y1, Y0, Y0        // m
	VMOVUPS Y0, (DX)
	VMULPS  (R8), Y10, Y1     // b2·v
	VMULPS  Y5, Y11, Y2       // (1−b2)·g
	VMULPS  Y5, Y2, Y2        // ((1−b2)·g)·g
	VADDPS  Y2, Y1, Y1        // v
	VMOVUPS Y1, (R8)
	VSQRTPS Y1, Y1
	VADDPS  Y13, Y1, Y1       // sqrt(v) + eps
	VMULPS  Y0, Y12, Y0       // step·m
	VDIVPS  Y1, Y0, Y0        // (step·m) / (sqrt(v) + eps)
	VMOVUPS (DI), Y4
	VSUBPS  Y0, Y4, Y4
	VMOVUPS Y4, (DI)
	VMOVUPS Y3, (SI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	DECQ    CX
	JNZ     adamLoop

adamDone:
	VZEROUPPER
	RET
