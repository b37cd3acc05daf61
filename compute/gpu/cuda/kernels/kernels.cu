// The kernels of pipetrain's device stage (package compute/gpu), written
// once here and compiled to PTX by `make ptx` (kernels.ptx, committed and
// embedded in the cuda build), which the GPU's driver compiles for its
// chip when the module loads. Each computes, in float32, what
// compute/gpu/fake.go computes one element at a time. No fast-math: the
// transcendental functions are CUDA's accurate ones (within 2 ulp).
//
// Every scalar parameter is 4 bytes and passed by the host in an 8-byte
// slot (gorgonia/cu's Launch copies 8 bytes per parameter).

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_TANH 2
#define ACT_SIGMOID 3
#define ACT_GELU 4
#define ACT_SILU 5

#define GELU_C 0.7978845608028654f

extern "C" {

// grid-stride loop over n elements
#define EACH(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

__global__ void fill(float *x, float v, int n) {
	EACH(i, n) { x[i] = v; }
}

// y[i, j] += b[j]
__global__ void bias_add(float *y, const float *b, int rows, int cols) {
	EACH(i, rows * cols) { y[i] += b[i % cols]; }
}

// dst[j] = beta * dst[j] + sum_i src[i, j]; one thread per column, the
// rows summed in order (the fake's order).
__global__ void sum_rows(float *dst, const float *src, int rows, int cols, float beta) {
	EACH(j, cols) {
		float s = 0;
		for (int i = 0; i < rows; i++) {
			s += src[i * cols + j];
		}
		dst[j] = beta * dst[j] + s;
	}
}

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void act(int f, float *y, const float *x, int n) {
	EACH(i, n) {
		float v = x[i];
		switch (f) {
		case ACT_RELU: v = v >= 0 ? v : 0; break;
		case ACT_TANH: v = tanhf(v); break;
		case ACT_SIGMOID: v = sigmoidf(v); break;
		case ACT_GELU: v = 0.5f * v * (1 + tanhf(GELU_C * (v + 0.044715f * v * v * v))); break;
		case ACT_SILU: v = v * sigmoidf(v); break;
		}
		y[i] = v;
	}
}

// dx = dy * f'(x), given y = f(x). relu's derivative at 0 is 1, as
// gorgonia's Rectify (x * [x >= 0]) has it.
__global__ void act_grad(int f, float *dx, const float *dy, const float *x, const float *y, int n) {
	EACH(i, n) {
		float v = x[i], d = 1;
		switch (f) {
		case ACT_RELU: d = v >= 0 ? 1 : 0; break;
		case ACT_TANH: d = 1 - y[i] * y[i]; break;
		case ACT_SIGMOID: d = y[i] * (1 - y[i]); break;
		case ACT_GELU: {
			float t = tanhf(GELU_C * (v + 0.044715f * v * v * v));
			d = 0.5f * (1 + t) + 0.5f * v * (1 - t * t) * GELU_C * (1 + 3 * 0.044715f * v * v);
			break;
		}
		case ACT_SILU: {
			float s = sigmoidf(v);
			d = s * (1 + v * (1 - s));
			break;
		}
		}
		dx[i] = dy[i] * d;
	}
}

// One block of XENT_THREADS threads per row: probs = softmax(row),
// loss[row] = max + log(sum exp(x - max)) - x[target].
#define XENT_THREADS 256
__global__ void xent(float *loss, float *probs, const float *logits, const float *targets, int rows, int cols) {
	__shared__ float red[XENT_THREADS];
	int r = blockIdx.x;
	if (r >= rows) {
		return;
	}
	const float *x = logits + (long long)r * cols;
	float *p = probs + (long long)r * cols;
	float m = -INFINITY;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		m = fmaxf(m, x[j]);
	}
	red[threadIdx.x] = m;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s) {
			red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
		}
		__syncthreads();
	}
	m = red[0];
	__syncthreads();
	float z = 0;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		float e = expf(x[j] - m);
		p[j] = e;
		z += e;
	}
	red[threadIdx.x] = z;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s) {
			red[threadIdx.x] += red[threadIdx.x + s];
		}
		__syncthreads();
	}
	z = red[0];
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		p[j] /= z;
	}
	if (threadIdx.x == 0) {
		loss[r] = m + logf(z) - x[(int)targets[r]];
	}
}

// d = scale * (probs - onehot(targets))
__global__ void xent_grad(float *d, const float *probs, const float *targets, int rows, int cols, float scale) {
	EACH(i, rows * cols) {
		float v = probs[i];
		if (i % cols == (int)targets[i / cols]) {
			v -= 1;
		}
		d[i] = scale * v;
	}
}

// block_sum is the sum of v over the block's NORM_THREADS threads, which
// every thread gets back; red is the block's shared scratch.
#define NORM_THREADS 256
__device__ float block_sum(float v, float *red) {
	red[threadIdx.x] = v;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s) {
			red[threadIdx.x] += red[threadIdx.x + s];
		}
		__syncthreads();
	}
	float sum = red[0];
	__syncthreads();
	return sum;
}

// One block per row: LayerNorm (mean != NULL) or RMSNorm (mean == NULL,
// no centring, no bias): y = (x - mean) * rstd * gain (+ bias), rstd =
// 1/sqrt(mean((x - mean)^2) + eps), keeping mean and rstd per row.
__global__ void norm(float *y, float *mean, float *rstd, const float *x, const float *gain, const float *bias, int rows, int cols, float eps) {
	__shared__ float red[NORM_THREADS];
	int r = blockIdx.x;
	if (r >= rows) {
		return;
	}
	const float *xr = x + (long long)r * cols;
	float *yr = y + (long long)r * cols;
	float mu = 0;
	if (mean) {
		float s = 0;
		for (int j = threadIdx.x; j < cols; j += blockDim.x) {
			s += xr[j];
		}
		mu = block_sum(s, red) / cols;
	}
	float ss = 0;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		float d = xr[j] - mu;
		ss += d * d;
	}
	float rs = rsqrtf(block_sum(ss, red) / cols + eps);
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		float v = (xr[j] - mu) * rs * gain[j];
		yr[j] = bias ? v + bias[j] : v;
	}
	if (threadIdx.x == 0) {
		rstd[r] = rs;
		if (mean) {
			mean[r] = mu;
		}
	}
}

// One block per row: with xh = (x - mean) * rstd and g = dy * gain,
// dx = rstd * (g - mean(g) - xh * mean(g * xh)), mean(g) dropped for
// RMSNorm (mean == NULL).
__global__ void norm_grad(float *dx, const float *dy, const float *x, const float *mean, const float *rstd, const float *gain, int rows, int cols) {
	__shared__ float red[NORM_THREADS];
	int r = blockIdx.x;
	if (r >= rows) {
		return;
	}
	long long o = (long long)r * cols;
	float mu = mean ? mean[r] : 0, rs = rstd[r];
	float sg = 0, sgx = 0;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		float g = dy[o + j] * gain[j];
		sg += g;
		sgx += g * (x[o + j] - mu) * rs;
	}
	sg = mean ? block_sum(sg, red) / cols : 0;
	sgx = block_sum(sgx, red) / cols;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		float xh = (x[o + j] - mu) * rs;
		dx[o + j] = rs * (dy[o + j] * gain[j] - sg - xh * sgx);
	}
}

// One thread per column: dgain[j] += sum_i dy * xh, dbias[j] += sum_i dy
// (dbias may be NULL).
__global__ void norm_param_grad(float *dgain, float *dbias, const float *dy, const float *x, const float *mean, const float *rstd, int rows, int cols) {
	EACH(j, cols) {
		float s = 0, sb = 0;
		for (int i = 0; i < rows; i++) {
			float d = dy[i * cols + j];
			s += d * (x[i * cols + j] - (mean ? mean[i] : 0)) * rstd[i];
			sb += d;
		}
		dgain[j] += s;
		if (dbias) {
			dbias[j] += sb;
		}
	}
}

// Hugging Face's rotary embedding: in each head of headDim, dimensions i
// and i + headDim/2 turn by the angle of position t = row mod context and
// frequency i, whose cosine and sine the tables hold at t * headDim/2 + i;
// sign -1 turns back (the inverse, and the rotation's gradient). One
// thread per pair.
__global__ void rope(float *y, const float *x, const float *cos, const float *sin, int rows, int width, int context, int headDim, float sign) {
	int half = headDim / 2, pairs = width / 2;
	EACH(k, rows * pairs) {
		int row = k / pairs, p = k % pairs;
		int head = p / half, i = p % half;
		long long h = (long long)row * width + head * headDim;
		int tab = (row % context) * half + i;
		float c = cos[tab], s = sign * sin[tab];
		float x1 = x[h + i], x2 = x[h + half + i];
		y[h + i] = x1 * c - x2 * s;
		y[h + half + i] = x2 * c + x1 * s;
	}
}

// Attention's softmax, one block of NORM_THREADS per row: p =
// softmax(scale * s) over the keys a row sees, all of them, or with
// causal the first (row mod cols) + 1; the others get 0.
__global__ void softmax(float *p, const float *s, int rows, int cols, float scale, int causal) {
	__shared__ float red[NORM_THREADS];
	int r = blockIdx.x;
	if (r >= rows) {
		return;
	}
	const float *sr = s + (long long)r * cols;
	float *pr = p + (long long)r * cols;
	int seen = causal ? r % cols + 1 : cols;
	float m = -INFINITY;
	for (int j = threadIdx.x; j < seen; j += blockDim.x) {
		m = fmaxf(m, scale * sr[j]);
	}
	red[threadIdx.x] = m;
	__syncthreads();
	for (int k = blockDim.x / 2; k > 0; k >>= 1) {
		if (threadIdx.x < k) {
			red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
		}
		__syncthreads();
	}
	m = red[0];
	__syncthreads();
	float z = 0;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		float e = j < seen ? expf(scale * sr[j] - m) : 0;
		pr[j] = e;
		z += e;
	}
	z = block_sum(z, red);
	for (int j = threadIdx.x; j < seen; j += blockDim.x) {
		pr[j] /= z;
	}
}

// ds = scale * p * (dp - sum_j p * dp), one block per row.
__global__ void softmax_grad(float *ds, const float *p, const float *dp, int rows, int cols, float scale) {
	__shared__ float red[NORM_THREADS];
	int r = blockIdx.x;
	if (r >= rows) {
		return;
	}
	long long o = (long long)r * cols;
	float dot = 0;
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		dot += p[o + j] * dp[o + j];
	}
	dot = block_sum(dot, red);
	for (int j = threadIdx.x; j < cols; j += blockDim.x) {
		ds[o + j] = scale * p[o + j] * (dp[o + j] - dot);
	}
}

// y[i, :] = table[tokens[i], :]
__global__ void embed(float *y, const float *table, const float *tokens, int rows, int width) {
	EACH(k, rows * width) {
		int i = k / width;
		y[k] = table[(long long)tokens[i] * width + k % width];
	}
}

// dtable[tokens[i], :] += dy[i, :]; rows with one token add atomically, in
// no fixed order.
__global__ void embed_grad(float *dtable, const float *dy, const float *tokens, int rows, int width) {
	EACH(k, rows * width) {
		int i = k / width;
		atomicAdd(&dtable[(long long)tokens[i] * width + k % width], dy[k]);
	}
}

__global__ void sgd(float *p, float *g, float lr, int n) {
	EACH(i, n) {
		p[i] -= lr * g[i];
		g[i] = 0;
	}
}

__global__ void momentum(float *p, float *g, float *buf, float lr, float mu, int n) {
	EACH(i, n) {
		buf[i] = mu * buf[i] + g[i];
		p[i] -= lr * buf[i];
		g[i] = 0;
	}
}

// Adam with the bias corrections folded into step and eps by the host.
__global__ void adam(float *p, float *g, float *m, float *v, float b1, float b2, float step, float eps, int n) {
	EACH(i, n) {
		float gi = g[i];
		m[i] = b1 * m[i] + (1 - b1) * gi;
		v[i] = b2 * v[i] + (1 - b2) * gi * gi;
		p[i] -= step * m[i] / (sqrtf(v[i]) + eps);
		g[i] = 0;
	}
}

__global__ void scale(float *x, float a, int n) {
	EACH(i, n) { x[i] *= a; }
}

__global__ void add_scaled(float *y, const float *x, float a, int n) {
	EACH(i, n) { y[i] += a * x[i]; }
}

} // extern "C"
