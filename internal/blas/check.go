package blas

import (
	"fmt"

	"gonum.org/v1/gonum/blas"
)

// The checks gonum makes before a call, so a bad call panics in Go with a
// message instead of reaching OpenBLAS, whose error handler prints and
// returns as if nothing had been asked. Matrices are row-major.

func checkMatrix(what string, rows, cols, length, ld int) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("blas: %s is %d×%d", what, rows, cols))
	}
	if ld < max(1, cols) {
		panic(fmt.Sprintf("blas: %s's leading dimension %d is below its %d columns", what, ld, cols))
	}
	if rows > 0 && cols > 0 && length < ld*(rows-1)+cols {
		panic(fmt.Sprintf("blas: %s (%d×%d, leading dimension %d) needs %d elements, has %d", what, rows, cols, ld, ld*(rows-1)+cols, length))
	}
}

// shape is the stored shape of an r×c operand read under t.
func shape(t blas.Transpose, r, c int) (int, int) {
	if t == blas.NoTrans {
		return r, c
	}
	return c, r
}

func checkGemm(tA, tB blas.Transpose, m, n, k, la, lda, lb, ldb, lc, ldc int) {
	ar, ac := shape(tA, m, k)
	br, bc := shape(tB, k, n)
	checkMatrix("A", ar, ac, la, lda)
	checkMatrix("B", br, bc, lb, ldb)
	checkMatrix("C", m, n, lc, ldc)
}

func checkGemv(tA blas.Transpose, m, n, la, lda, lx, incX, ly, incY int) {
	checkMatrix("A", m, n, la, lda)
	xn, yn := n, m
	if tA != blas.NoTrans {
		xn, yn = m, n
	}
	checkVector("x", xn, lx, incX)
	checkVector("y", yn, ly, incY)
}

func checkGer(m, n, lx, incX, ly, incY, la, lda int) {
	checkVector("x", m, lx, incX)
	checkVector("y", n, ly, incY)
	checkMatrix("A", m, n, la, lda)
}

func checkVecs(n, lx, incX, ly, incY int) {
	checkVector("x", n, lx, incX)
	checkVector("y", n, ly, incY)
}

func checkVector(what string, n, length, inc int) {
	if n < 0 {
		panic(fmt.Sprintf("blas: %s has %d elements", what, n))
	}
	if inc == 0 {
		panic(fmt.Sprintf("blas: %s has increment 0", what))
	}
	if inc < 0 {
		inc = -inc
	}
	if n > 0 && length < (n-1)*inc+1 {
		panic(fmt.Sprintf("blas: %s (%d elements, increment %d) needs %d, has %d", what, n, inc, (n-1)*inc+1, length))
	}
}
