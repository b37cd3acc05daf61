// Package parallel cuts elementwise work over [0, n) into contiguous ranges
// done at once, for the parts of a step that are neither products nor
// transfers: the optimizer's update and the gradient accumulation.
package parallel

import "sync"

// Ranges runs f over [0, n) in workers contiguous ranges at once, one
// goroutine each (the caller's included), or whole on the caller's
// goroutine when workers <= 1 or n < min: below some size starting
// goroutines costs more than the work. f must depend on nothing outside its
// range, so that the result does not depend on workers.
func Ranges(n, workers, min int, f func(lo, hi int)) {
	if workers <= 1 || n < min {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for k := 1; k < workers; k++ {
		wg.Go(func() { f(k*n/workers, (k+1)*n/workers) })
	}
	f(0, n/workers)
	wg.Wait()
}
