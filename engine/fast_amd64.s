//go:build amd64 && !nosimd

#include "textflag.h"

// Eight lanes at a time; each lane is the IEEE operation the Go loop does
// (a's operand first, as there), so the results are the same bits.

// func addAVX(dst, a, b *float32, n int)
TEXT ·addAVX(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ   addDone

addLoop:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     addLoop

addDone:
	VZEROUPPER
	RET

// func mulAVX(dst, a, b *float32, n int)
TEXT ·mulAVX(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ   mulDone

mulLoop:
	VMOVUPS (SI), Y0
	VMULPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     mulLoop

mulDone:
	VZEROUPPER
	RET

DATA one<>+0(SB)/4, $1.0
GLOBL one<>(SB), RODATA|NOPTR, $4

// func gteAVX(dst, a *float32, s float32, n int)
//
// 1 where a >= s, else 0: an ordered comparison, false for NaN as in Go.
TEXT ·gteAVX(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	VBROADCASTSS s+16(FP), Y1
	VBROADCASTSS one<>(SB), Y2
	MOVQ         n+24(FP), CX
	SHRQ         $3, CX
	JZ           gteDone

gteLoop:
	VMOVUPS (SI), Y0
	VCMPPS  $0x1d, Y1, Y0, Y0 // GE_OQ: a >= s
	VANDPS  Y2, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     gteLoop

gteDone:
	VZEROUPPER
	RET
