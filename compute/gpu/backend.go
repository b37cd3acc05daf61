// Package gpu is the stage of a device that computes outside host memory
// (cuda:N), written once against Backend, the few operations such a device
// offers: memory, copies to and from the host, a matrix product and the
// named kernels of the layers it runs. The cuda build tag supplies the
// CUDA backend (package compute/gpu/cuda); Fake, always built, computes
// the same operations in host memory, so that everything but the kernels
// themselves (placement, copies at stage boundaries, weights and optimizer
// state kept on the device, checkpoints) is tested by go test on machines
// without a GPU.
//
// The stage runs models whose layers are all Dense (the mlp family), in
// float32; Open refuses any other layer or dtype by name.
package gpu

// Buffer is a backend's device memory holding Len float32s.
type Buffer interface{ Len() int }

// Act names an activation: "" (none), relu, tanh, sigmoid, gelu (tanh
// approximation) and silu.
type Act string

// Backend is one device's memory and kernels. Every operation is queued in
// order on the device's compute stream; a copy to the host returns once the
// values are there. Matrices are row-major. Operations that add to a
// gradient read and write it in place; the optimizer updates zero their
// gradient, as optim.Optimizer.Step does.
type Backend interface {
	// Name describes the device ("cuda:0 NVIDIA H100", "fake").
	Name() string
	Alloc(n int) (Buffer, error)
	Free(b Buffer)
	// Upload copies host values into dst; Download copies src to the host.
	// Both go through pinned host memory on a transfer stream where the
	// device has one.
	Upload(dst Buffer, src []float32) error
	Download(dst []float32, src Buffer) error
	Copy(dst, src Buffer) error
	Fill(dst Buffer, v float32) error

	// Gemm is C = alpha·op(A)·op(B) + beta·C with op(A) m×k and op(B) k×n;
	// transA and transB transpose the stored A and B.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a, b Buffer, beta float32, c Buffer) error
	// AddBias adds bias[j] to every row of y (rows × cols).
	AddBias(y, bias Buffer, rows, cols int) error
	// SumRows is dst[j] = beta·dst[j] + Σ_i src[i, j]: a bias's gradient.
	SumRows(dst, src Buffer, rows, cols int, beta float32) error
	// Activate is y = f(x) elementwise; ActivateGrad is dx = dy·f'(x),
	// given y = f(x) too (tanh and sigmoid read their derivative from it).
	Activate(f Act, y, x Buffer) error
	ActivateGrad(f Act, dx, dy, x, y Buffer) error
	// Xent is the softmax cross-entropy of logits (rows × cols) against
	// the class of each row (targets, a class index held as a float32):
	// probs = softmax(logits) and rowLoss[i] = logsumexp(row i) − logit of
	// its target. XentGrad is dlogits = scale·(probs − onehot(targets)).
	Xent(rowLoss, probs, logits, targets Buffer, rows, cols int) error
	XentGrad(dlogits, probs, targets Buffer, rows, cols int, scale float32) error

	// LayerNorm normalises each row of x (rows × cols) to zero mean and
	// unit variance, y = (x − mean)·rstd·gain + bias with rstd =
	// 1/√(var + eps), keeping each row's mean and rstd for the backward.
	// RMSNorm is y = x·rstd·gain with rstd = 1/√(mean(x²) + eps). Their
	// gradients write dx and add the gain's and bias's gradients to dgain
	// and dbias. No model on the device uses them yet (docs/gpu.md).
	LayerNorm(y, mean, rstd, x, gain, bias Buffer, rows, cols int, eps float32) error
	LayerNormGrad(dx, dgain, dbias, dy, x, mean, rstd, gain Buffer, rows, cols int) error
	RMSNorm(y, rstd, x, gain Buffer, rows, cols int, eps float32) error
	RMSNormGrad(dx, dgain, dy, x, rstd, gain Buffer, rows, cols int) error

	// Rope turns each head of x (rows × width, row r at position r mod
	// context, heads of headDim) as Hugging Face's apply_rotary_pos_emb:
	// dimensions i and i+headDim/2 by the angle whose cosine and sine are
	// cos and sin at t·headDim/2 + i (tables the caller makes). inverse
	// turns back, which is also the rotation's gradient.
	Rope(y, x, cos, sin Buffer, rows, width, context, headDim int, inverse bool) error

	// Softmax is attention's: p = softmax(scale·s) along each row of s
	// (rows × cols, cols the keys), and with causal, row r sees keys
	// 0 … r mod cols only (the others get probability 0). SoftmaxGrad is
	// its gradient, ds = scale·p·(dp − Σ_j p·dp). Attention is these
	// between products (Gemm) of queries, keys and values.
	Softmax(p, s Buffer, rows, cols int, scale float32, causal bool) error
	SoftmaxGrad(ds, p, dp Buffer, rows, cols int, scale float32) error
	// Embed copies row tokens[i] of table (a token id held as a float32)
	// into row i of y, of width columns; EmbedGrad adds row i of dy to row
	// tokens[i] of dtable.
	Embed(y, table, tokens Buffer, rows, width int) error
	EmbedGrad(dtable, dy, tokens Buffer, rows, width int) error

	// SGD is p −= lr·g; Momentum is buf = mu·buf + g, p −= lr·buf; Adam is
	// m = b1·m + (1−b1)·g, v = b2·v + (1−b2)·g², p −= step·m/(√v + eps)
	// with step and eps bias-corrected by the caller (optim's efficient
	// form). Each zeroes g.
	SGD(p, g Buffer, lr float32) error
	Momentum(p, g, buf Buffer, lr, mu float32) error
	Adam(p, g, m, v Buffer, b1, b2, step, eps float32) error
	// Scale is x = a·x (AdamW's decoupled decay); AddScaled is y += a·x
	// (L2 decay added to a gradient).
	Scale(x Buffer, a float32) error
	AddScaled(y, x Buffer, a float32) error
}
