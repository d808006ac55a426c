// One "step" over a ragged uint8 HWC RGB batch: every sample runs its own per-sample program.
//
// A step is one launch for the whole batch. Each sample carries 16 float parameters (prm[s * 16 + k]);
// prm[0] is the code below, the rest its arguments. A batch may mix codes (RandAugment picks an op per
// image), so the code is read per sample. Per-image statistics (grey sum, channel min/max, equalize
// LUTs) come from stats_u8 / equalize_lut launched just before on the same stream.
//
// Every code has a NumPy twin in gpubatch/engine/ops/pixel.py (step_cpu) computing the same float
// expressions; results agree to rounding.
//
// NPRM, MAXK and enum Code are not written here: gpubatch/engine/ops/pixel.py (cuda_header) generates
// them from its own constants and kernels/__init__.py puts them before this text.
#include "common.cuh"

__device__ __forceinline__ float grey(float r, float g, float b) {
    return 0.2989f * r + 0.587f * g + 0.114f * b;  // ITU-R 601-2 luma, torchvision's weights
}

__device__ __forceinline__ int reflect(int i, int n) {  // torch "reflect" padding (edge not repeated)
    if (n == 1) return 0;
    if (i < 0) i = -i;
    if (i >= n) i = 2 * n - 2 - i;
    return min(max(i, 0), n - 1);
}

__device__ void hue_shift(float& r, float& g, float& b, float shift) {
    const float mx = fmaxf(r, fmaxf(g, b)), mn = fminf(r, fminf(g, b)), c = mx - mn;
    const float s = mx > 0.f ? c / mx : 0.f;
    float h = 0.f;
    if (c > 0.f) {
        if (mx == r) h = (g - b) / c;
        else if (mx == g) h = 2.f + (b - r) / c;
        else h = 4.f + (r - g) / c;
        h = h / 6.f;
        h = h - floorf(h);
    }
    h = h + shift;
    h = h - floorf(h);
    const float h6 = h * 6.f, fl = floorf(h6), f = h6 - fl;
    const int i = ((int)fl) % 6;
    const float v = mx, p = v * (1.f - s), q = v * (1.f - s * f), t = v * (1.f - s * (1.f - f));
    switch (i) {
        case 0: r = v; g = t; b = p; break;
        case 1: r = q; g = v; b = p; break;
        case 2: r = p; g = v; b = t; break;
        case 3: r = p; g = q; b = v; break;
        case 4: r = t; g = p; b = v; break;
        default: r = v; g = p; b = q; break;
    }
}

#ifdef KEEP_step_u8
extern "C" __global__ void step_u8(
    const unsigned long long* __restrict__ in_ptr,  // N: base address of each uint8 HWC RGB input
    const int* __restrict__ in_shape,               // N x 3: height, width, row stride in bytes
    const int* __restrict__ out_shape,              // N x 2
    const long long* __restrict__ out_off,          // N: byte offset of each output
    const int* __restrict__ first_block,            // N
    int n,
    const float* __restrict__ prm,                  // N x 16
    const unsigned long long* __restrict__ gsum,    // N: sum of 10000 * grey (CONTRAST), or null
    const int* __restrict__ minmax,                 // N x 6: min rgb, max rgb (AUTOCONTRAST), or null
    const unsigned char* __restrict__ lut,          // N x 768 (EQUALIZE), or null
    unsigned char* __restrict__ out)
{
    const int s = find_sample(first_block, n, blockIdx.x);
    const int oh = out_shape[2 * s], ow = out_shape[2 * s + 1];
    const int pix = (blockIdx.x - first_block[s]) * blockDim.x + threadIdx.x;
    if (pix >= oh * ow) return;
    const int oy = pix / ow, ox = pix - oy * ow;
    const int ih = in_shape[3 * s], iw = in_shape[3 * s + 1], stride = in_shape[3 * s + 2];
    const unsigned char* __restrict__ src = reinterpret_cast<const unsigned char*>(in_ptr[s]);
    const float* p = prm + (long long)s * NPRM;
    const int code = (int)p[0];
    unsigned char* o = out + out_off[s] + 3LL * pix;
    float c[3];

    if (code == WARP) {
        // p[1..9]: row-major 3x3 map from output pixel centres to input coordinates; p[10..12] fill;
        // p[13]: 0 bilinear, 1 nearest. Taps outside the image read the fill colour.
        const float xo = ox + 0.5f, yo = oy + 0.5f;
        const float zx = p[1] * xo + p[2] * yo + p[3];
        const float zy = p[4] * xo + p[5] * yo + p[6];
        const float zz = p[7] * xo + p[8] * yo + p[9];
        const float x = zx / zz, y = zy / zz;
        if (p[13] != 0.f) {
            const int xi = (int)floorf(x), yi = (int)floorf(y);
            const bool in = xi >= 0 && xi < iw && yi >= 0 && yi < ih;
            for (int k = 0; k < 3; ++k) c[k] = in ? (float)src[(long long)yi * stride + 3 * xi + k] : p[10 + k];
        } else {
            const float fx = x - 0.5f, fy = y - 0.5f;
            const int x0 = (int)floorf(fx), y0 = (int)floorf(fy);
            const float ax = fx - x0, ay = fy - y0;
            c[0] = c[1] = c[2] = 0.f;
            for (int dy = 0; dy < 2; ++dy) {
                const int yy = y0 + dy;
                const float wy = dy ? ay : 1.f - ay;
                for (int dx = 0; dx < 2; ++dx) {
                    const int xx = x0 + dx;
                    const float w = wy * (dx ? ax : 1.f - ax);
                    const bool in = xx >= 0 && xx < iw && yy >= 0 && yy < ih;
                    for (int k = 0; k < 3; ++k)
                        c[k] += w * (in ? (float)src[(long long)yy * stride + 3 * xx + k] : p[10 + k]);
                }
            }
        }
        for (int k = 0; k < 3; ++k) o[k] = to_u8(c[k]);
        return;
    }
    if (code == BLUR) {
        // p[1], p[2]: kernel width, height (odd); p[3], p[4]: sigma x, y. Gaussian taps normalised per
        // axis, reflect padding (torchvision's gaussian_blur).
        const int kx = min((int)p[1], MAXK), ky = min((int)p[2], MAXK);
        const float sx = p[3], sy = p[4];
        // (wy computed as each row is reached, wx once into an array: 256 bytes of stack a thread, which the driver
        // holds for every thread the GPU can run at once; the loops rolled: unrolled, this file took NVRTC 2.35 s
        // and this kernel alone now 0.39 s, H200 host, 2026-12-03; kernels/jpeg.cu says why that counts)
        float wx[MAXK], sumx = 0.f, sumy = 0.f;
#pragma unroll 1
        for (int i = 0; i < kx; ++i) { const float d = (i - (kx - 1) * 0.5f) / sx; wx[i] = expf(-0.5f * d * d); sumx += wx[i]; }
        c[0] = c[1] = c[2] = 0.f;
#pragma unroll 1
        for (int j = 0; j < ky; ++j) {
            const float d = (j - (ky - 1) * 0.5f) / sy, wy = expf(-0.5f * d * d);
            sumy += wy;
            const unsigned char* row = src + (long long)reflect(oy + j - ky / 2, ih) * stride;
            float r0 = 0.f, r1 = 0.f, r2 = 0.f;
#pragma unroll 1
            for (int i = 0; i < kx; ++i) {
                const unsigned char* q = row + 3 * reflect(ox + i - kx / 2, iw);
                r0 = fmaf(wx[i], (float)q[0], r0);
                r1 = fmaf(wx[i], (float)q[1], r1);
                r2 = fmaf(wx[i], (float)q[2], r2);
            }
            c[0] = fmaf(wy, r0, c[0]);
            c[1] = fmaf(wy, r1, c[1]);
            c[2] = fmaf(wy, r2, c[2]);
        }
        const float inv = 1.f / (sumx * sumy);
        for (int k = 0; k < 3; ++k) o[k] = to_u8(c[k] * inv);
        return;
    }
    const unsigned char* q = src + (long long)oy * stride + 3 * ox;
    c[0] = q[0]; c[1] = q[1]; c[2] = q[2];
    switch (code) {
        case BRIGHTNESS:
            for (int k = 0; k < 3; ++k) c[k] *= p[1];
            break;
        case CONTRAST: {
            const float mean = (float)((double)gsum[s] / (10000.0 * (double)ih * (double)iw));
            for (int k = 0; k < 3; ++k) c[k] = p[1] * c[k] + (1.f - p[1]) * mean;
            break;
        }
        case SATURATION: {
            const float g = grey(c[0], c[1], c[2]);
            for (int k = 0; k < 3; ++k) c[k] = p[1] * c[k] + (1.f - p[1]) * g;
            break;
        }
        case HUE:
            hue_shift(c[0], c[1], c[2], p[1]);
            break;
        case GRAYSCALE: {
            const float g = grey(c[0], c[1], c[2]);
            c[0] = c[1] = c[2] = g;
            break;
        }
        case SOLARIZE:
            for (int k = 0; k < 3; ++k) c[k] = c[k] >= p[1] ? 255.f - c[k] : c[k];
            break;
        case POSTERIZE: {
            const int mask = (0xff << (8 - (int)p[1])) & 0xff;
            for (int k = 0; k < 3; ++k) c[k] = (float)((int)c[k] & mask);
            break;
        }
        case INVERT:
            for (int k = 0; k < 3; ++k) c[k] = 255.f - c[k];
            break;
        case AUTOCONTRAST:
            for (int k = 0; k < 3; ++k) {
                const int lo = minmax[6 * s + k], hi = minmax[6 * s + 3 + k];
                if (hi > lo) c[k] = (c[k] - lo) * (255.f / (float)(hi - lo));
            }
            break;
        case EQUALIZE:
            for (int k = 0; k < 3; ++k) c[k] = lut[768LL * s + 256 * k + (int)c[k]];
            break;
        case SHARPNESS:
            // PIL's ImageEnhance.Sharpness: blend with the SMOOTH-filtered image, borders untouched.
            if (oy > 0 && ox > 0 && oy < ih - 1 && ox < iw - 1) {
                for (int k = 0; k < 3; ++k) {
                    float acc = 4.f * c[k];
                    for (int dy = -1; dy <= 1; ++dy)
                        for (int dx = -1; dx <= 1; ++dx)
                            acc += (float)src[(long long)(oy + dy) * stride + 3 * (ox + dx) + k];
                    const float smooth = rintf(acc / 13.f);
                    c[k] = smooth + p[1] * (c[k] - smooth);
                }
            }
            break;
        case NOISE: {
            // p[1]: sigma, p[2]: mean (pixel levels), p[3]: 24-bit seed of this image.
            const unsigned int seed = (unsigned int)p[3];
            for (int k = 0; k < 3; ++k) {
                const unsigned int idx = 2u * (3u * (unsigned int)pix + k);
                const float u1 = unit(seed, idx), u2 = unit(seed, idx + 1u);
                const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
                c[k] += p[2] + p[1] * z;
            }
            break;
        }
        case ERASE: {
            // p[1..4]: top, left, height, width; p[5..7]: value; p[8]: 1 = uniform random values, seed p[9].
            const int y0 = (int)p[1], x0 = (int)p[2];
            if (oy >= y0 && oy < y0 + (int)p[3] && ox >= x0 && ox < x0 + (int)p[4]) {
                for (int k = 0; k < 3; ++k)
                    c[k] = p[8] != 0.f ? floorf(unit((unsigned int)p[9], 3u * (unsigned int)pix + k) * 256.f) : p[5 + k];
            }
            break;
        }
        default:
            break;
    }
    o[0] = to_u8(c[0]);
    o[1] = to_u8(c[1]);
    o[2] = to_u8(c[2]);
}
#endif

// Per-sample statistics of the step's input: flags 1 = grey sum, 2 = channel min/max, 4 = histograms.
// Integer accumulation only, so results do not depend on the order blocks finish (reproducible runs).
#ifdef KEEP_stats_u8
extern "C" __global__ void stats_u8(
    const unsigned long long* __restrict__ in_ptr, const int* __restrict__ in_shape,
    const int* __restrict__ first_block, int n, int flags,
    unsigned long long* __restrict__ gsum, int* __restrict__ minmax, unsigned int* __restrict__ hist)
{
    __shared__ unsigned int sh[768];
    const int s = find_sample(first_block, n, blockIdx.x);
    const int ih = in_shape[3 * s], iw = in_shape[3 * s + 1], stride = in_shape[3 * s + 2];
    const int pix = (blockIdx.x - first_block[s]) * blockDim.x + threadIdx.x;
    const bool valid = pix < ih * iw;
    if (flags & 4) {
        for (int i = threadIdx.x; i < 768; i += blockDim.x) sh[i] = 0u;
        __syncthreads();
    }
    int r = 0, g = 0, b = 0;
    if (valid) {
        const unsigned char* q = reinterpret_cast<const unsigned char*>(in_ptr[s]) + (long long)(pix / iw) * stride
                                 + 3 * (pix % iw);
        r = q[0]; g = q[1]; b = q[2];
    }
    if (flags & 1) {
        unsigned long long v = valid ? (unsigned long long)(2989 * r + 5870 * g + 1140 * b) : 0ull;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if ((threadIdx.x & 31) == 0 && v) atomicAdd(gsum + s, v);
    }
    if (flags & 2) {
        int mn[3] = {valid ? r : 255, valid ? g : 255, valid ? b : 255};
        int mx[3] = {valid ? r : 0, valid ? g : 0, valid ? b : 0};
        for (int off = 16; off > 0; off >>= 1)
            for (int k = 0; k < 3; ++k) {
                mn[k] = min(mn[k], __shfl_down_sync(0xffffffffu, mn[k], off));
                mx[k] = max(mx[k], __shfl_down_sync(0xffffffffu, mx[k], off));
            }
        if ((threadIdx.x & 31) == 0)
            for (int k = 0; k < 3; ++k) { atomicMin(minmax + 6 * s + k, mn[k]); atomicMax(minmax + 6 * s + 3 + k, mx[k]); }
    }
    if (flags & 4) {
        if (valid) { atomicAdd(sh + r, 1u); atomicAdd(sh + 256 + g, 1u); atomicAdd(sh + 512 + b, 1u); }
        __syncthreads();
        for (int i = threadIdx.x; i < 768; i += blockDim.x)
            if (sh[i]) atomicAdd(hist + 768LL * s + i, sh[i]);
    }
}
#endif

// PIL's ImageOps.equalize LUT, one thread per (sample, channel).
#ifdef KEEP_equalize_lut
extern "C" __global__ void equalize_lut(const unsigned int* __restrict__ hist, int n, unsigned char* __restrict__ lut)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= 3 * n) return;
    const unsigned int* h = hist + 256LL * t;
    unsigned char* l = lut + 256LL * t;
    unsigned long long total = 0;
    int last = -1, nonzero = 0;
    for (int i = 0; i < 256; ++i) if (h[i]) { total += h[i]; last = i; ++nonzero; }
    const unsigned long long step = nonzero > 1 ? (total - h[last]) / 255ull : 0ull;
    if (step == 0) {
        for (int i = 0; i < 256; ++i) l[i] = (unsigned char)i;
        return;
    }
    unsigned long long acc = step / 2;
    for (int i = 0; i < 256; ++i) {
        const unsigned long long v = acc / step;
        l[i] = (unsigned char)(v > 255ull ? 255ull : v);
        acc += h[i];
    }
}
#endif
