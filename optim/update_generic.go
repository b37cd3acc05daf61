//go:build !amd64 || nosimd

package optim

func vectorised(update32) int { return 0 }
