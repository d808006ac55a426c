// Audio kernels over a ragged batch: rows (one channel of one record each) laid end to end in one
// buffer, with an offset table per row. One thread per output element; the row is found by a binary
// search of the offset table (last_at_most; rows are few, outputs many).
#include "common.cuh"


// Polyphase resampling by up/down (scipy's resample_poly, with gpubatch's filter h of taps = 2*half+1
// at the upsampled rate, scaled by up): y[j] = sum_k h[k] * u[j*down + half - k], where u is the row
// upsampled by up (zeros between samples). Only the taps that meet a sample are visited.
#ifdef KEEP_resample_poly
extern "C" __global__ void resample_poly(const float* __restrict__ x, float* __restrict__ y,
                                         const long long* __restrict__ in_off, const long long* __restrict__ out_off,
                                         int rows, const float* __restrict__ h, int taps, int up, int down,
                                         long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int r = last_at_most(out_off, rows, i);
    const long long j = i - out_off[r];
    const long long n = in_off[r + 1] - in_off[r];
    const float* row = x + in_off[r];
    const long long half = (taps - 1) / 2;
    const long long t = j * down + half;
    const int k0 = (int)(t % up);
    const long long n0 = t / up;
    float acc = 0.f;
    for (int k = k0; k < taps; k += up) {
        const long long s = n0 - (k - k0) / up;
        if (s < 0) break;
        if (s < n) acc += h[k] * row[s];
    }
    y[i] = acc;
}
#endif

__device__ __forceinline__ long long reflect_index(long long i, long long n) {
    if (n == 1) return 0;
    while (i < 0 || i >= n) {
        if (i < 0) i = -i;
        if (i >= n) i = 2 * n - 2 - i;
    }
    return i;
}

// Centred, windowed STFT frames of every row: frame f of a row starts at f*hop - n_fft/2; samples
// outside the row are its reflection (reflect != 0, torch's "reflect") or zero. out: (frames, n_fft).
#ifdef KEEP_frames
extern "C" __global__ void frames(const float* __restrict__ x, float* __restrict__ out,
                                  const long long* __restrict__ in_off, const long long* __restrict__ f_off,
                                  int rows, const float* __restrict__ window, int n_fft, int hop, int reflect,
                                  long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long f = i / n_fft;
    const int k = (int)(i - f * n_fft);
    const int r = last_at_most(f_off, rows, f);
    const long long n = in_off[r + 1] - in_off[r];
    long long s = (f - f_off[r]) * hop - n_fft / 2 + k;
    float v = 0.f;
    if (s >= 0 && s < n) {
        v = x[in_off[r] + s];
    } else if (reflect && n > n_fft / 2) {
        v = x[in_off[r] + reflect_index(s, n)];
    }
    out[i] = v * window[k];
}
#endif

// y = x + sigma[r] * N(0, 1) over a ragged batch of whole records laid end to end (record r is
// [off[r], off[r + 1])): the noise of element j of record r a Box-Muller pair of the counter-based
// stream of seed[r] (NumPy twin: noise_np).
#ifdef KEEP_add_noise
extern "C" __global__ void add_noise(const float* __restrict__ x, float* __restrict__ y,
                                     const long long* __restrict__ off, int rows, const float* __restrict__ sigma,
                                     const unsigned int* __restrict__ seed, long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int r = last_at_most(off, rows, i);
    const unsigned int idx = (unsigned int)(i - off[r]);
    const float u1 = unit(seed[r], idx * 2u), u2 = unit(seed[r], idx * 2u + 1u);
    y[i] = x[i] + sigma[r] * sqrtf(-2.f * logf(u1)) * cosf(6.283185307179586f * u2);
}
#endif
