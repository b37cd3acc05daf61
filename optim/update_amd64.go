//go:build amd64 && !nosimd

package optim

import "golang.org/x/sys/cpu"

// hasAVX says whether this CPU (and its OS) runs update_amd64.s's
// kernels, which use AVX alone.
var hasAVX = cpu.X86.HasAVX

// The kernels run over the first n&^7 elements; the rest is left to the
// caller.

//go:noescape
func sgdAVX(p, grad *float32, n int, lr float32)

//go:noescape
func momentumAVX(p, grad, buf *float32, n int, lr, mu float32)

//go:noescape
func adamAVX(p, grad, m, v *float32, n int, c *adamConsts)

// vectorised updates the leading elements of a float32 parameter that the
// kernels take and returns how many; update does the rest.
func vectorised(u update32) int {
	n := len(u.p) &^ 7
	if !hasAVX || n == 0 {
		return 0
	}
	switch {
	case u.adam != nil:
		adamAVX(&u.p[0], &u.g[0], &u.m[0], &u.v[0], n, u.adam)
	case u.buf != nil:
		momentumAVX(&u.p[0], &u.g[0], &u.buf[0], n, u.lr, u.mu)
	default:
		sgdAVX(&u.p[0], &u.g[0], n, u.lr)
	}
	return n
}
