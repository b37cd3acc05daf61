//go:build amd64 && !nosimd

#include "textflag.h"

// func cpuid1ECX() uint32
TEXT ·cpuid1ECX(SB), NOSPLIT, $0-4
	MOVL  $1, AX
	XORL  CX, CX
	CPUID
	MOVL  CX, ret+0(FP)
	RET

// F16C's conversions are IEEE's with rounding to nearest even (immediate 0):
// subnormals kept, NaNs quieted with their payload truncated, as the Go
// conversions do.

// func toF16(dst *uint16, src *float32, n int)
TEXT ·toF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ CX, DX
	ANDQ $7, DX
	SHRQ $3, CX
	JZ   toF16Tail

toF16Loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       toF16Loop

toF16Tail:
	TESTQ DX, DX
	JZ    toF16Done

toF16One:
	VMOVSS    (SI), X0
	VCVTPS2PH $0, X0, X1
	VMOVD     X1, AX
	MOVW      AX, (DI)
	ADDQ      $4, SI
	ADDQ      $2, DI
	DECQ      DX
	JNZ       toF16One

toF16Done:
	VZEROUPPER
	RET

// func fromF16(dst *float32, src *uint16, n int)
TEXT ·fromF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ CX, DX
	ANDQ $7, DX
	SHRQ $3, CX
	JZ   fromF16Tail

fromF16Loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       fromF16Loop

fromF16Tail:
	TESTQ DX, DX
	JZ    fromF16Done

fromF16One:
	MOVWLZX   (SI), AX
	VMOVD     AX, X0
	VCVTPH2PS X0, X1
	VMOVSS    X1, (DI)
	ADDQ      $2, SI
	ADDQ      $4, DI
	DECQ      DX
	JNZ       fromF16One

fromF16Done:
	VZEROUPPER
	RET

DATA bf16One<>+0(SB)/4, $1
GLOBL bf16One<>(SB), RODATA|NOPTR, $4
DATA bf16Bias<>+0(SB)/4, $0x7fff
GLOBL bf16Bias<>(SB), RODATA|NOPTR, $4
DATA bf16Abs<>+0(SB)/4, $0x7fffffff
GLOBL bf16Abs<>(SB), RODATA|NOPTR, $4
DATA bf16Inf<>+0(SB)/4, $0x7f800000
GLOBL bf16Inf<>(SB), RODATA|NOPTR, $4
DATA bf16Quiet<>+0(SB)/4, $0x40
GLOBL bf16Quiet<>(SB), RODATA|NOPTR, $4

// bfloat16 is float32's top half, rounded to nearest even on the half
// dropped; a NaN keeps its top half with the quiet bit set.
//
// func toBF16(dst *uint16, src *float32, n int)
TEXT ·toBF16(SB), NOSPLIT, $0-24
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VPBROADCASTD bf16One<>(SB), Y8
	VPBROADCASTD bf16Bias<>(SB), Y9
	VPBROADCASTD bf16Abs<>(SB), Y10
	VPBROADCASTD bf16Inf<>(SB), Y11
	VPBROADCASTD bf16Quiet<>(SB), Y12
	MOVQ         CX, DX
	ANDQ         $7, DX
	SHRQ         $3, CX
	JZ           toBF16Tail

toBF16Loop:
	VMOVDQU   (SI), Y0
	VPSRLD    $16, Y0, Y1
	VPAND     Y8, Y1, Y2
	VPADDD    Y9, Y2, Y2
	VPADDD    Y2, Y0, Y2
	VPSRLD    $16, Y2, Y2     // rounded
	VPAND     Y10, Y0, Y3
	VPCMPGTD  Y11, Y3, Y3     // NaN: |b| above infinity's bits
	VPOR      Y12, Y1, Y1     // kept
	VPBLENDVB Y3, Y1, Y2, Y2
	// 8 × 32 → 8 × 16 bits: pack within each 128-bit half, then bring
	// the halves' low quadwords together.
	VPACKUSDW Y2, Y2, Y2
	VPERMQ    $0x08, Y2, Y2
	VMOVDQU   X2, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       toBF16Loop

toBF16Tail:
	TESTQ DX, DX
	JZ    toBF16Done

toBF16One:
	MOVL (SI), AX
	MOVL AX, BX
	ANDL $0x7fffffff, BX
	CMPL BX, $0x7f800000
	JHI  toBF16NaN
	MOVL AX, BX
	SHRL $16, BX
	ANDL $1, BX
	ADDL $0x7fff, BX
	ADDL BX, AX
	SHRL $16, AX
	JMP  toBF16Store

toBF16NaN:
	SHRL $16, AX
	ORL  $0x40, AX

toBF16Store:
	MOVW AX, (DI)
	ADDQ $4, SI
	ADDQ $2, DI
	DECQ DX
	JNZ  toBF16One

toBF16Done:
	VZEROUPPER
	RET

// func fromBF16(dst *float32, src *uint16, n int)
TEXT ·fromBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ CX, DX
	ANDQ $7, DX
	SHRQ $3, CX
	JZ   fromBF16Tail

fromBF16Loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       fromBF16Loop

fromBF16Tail:
	TESTQ DX, DX
	JZ    fromBF16Done

fromBF16One:
	MOVWLZX (SI), AX
	SHLL    $16, AX
	MOVL    AX, (DI)
	ADDQ    $2, SI
	ADDQ    $4, DI
	DECQ    DX
	JNZ     fromBF16One

fromBF16Done:
	VZEROUPPER
	RET
