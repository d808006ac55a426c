// Fused batched resample: crop window + antialiased bilinear resize + flip + normalize + layout + dtype.
//
// One launch covers a whole ragged batch. Each sample maps output pixel centres to input positions with
// an affine per axis (in = a + b * (o + 0.5)); a negative b is a flip. The filter is Pillow's
// antialiased bilinear: a triangle whose radius is max(|b|, 1) input pixels, taps outside the image
// dropped and the weights renormalised, so a crop folded into the window reads real pixels beyond its
// edge exactly as Pillow's resize(box=...) does. Output pixels whose centre falls outside the image are
// the fill colour (zero unless a pad says otherwise), matching crop-then-pad on the CPU.
#include <cuda_fp16.h>
#include "common.cuh"

struct Geo {
    float ay, by, ax, bx;  // in_y = ay + by * (oy + 0.5); in_x = ax + bx * (ox + 0.5)
};

template <typename T> __device__ __forceinline__ T cvt(float v);
template <> __device__ __forceinline__ unsigned char cvt<unsigned char>(float v) {
    return to_u8(v);
}
template <> __device__ __forceinline__ __half cvt<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ float cvt<float>(float v) { return v; }

template <typename T, bool CHW>
__device__ void resample_impl(
    const unsigned long long* __restrict__ in_ptr,  // N: base address of each uint8 HWC RGB image
    const int* __restrict__ in_shape,               // N x 3: height, width, row stride in bytes
    const Geo* __restrict__ geo,                    // N
    const int* __restrict__ out_shape,              // N x 2: out height, out width
    const long long* __restrict__ out_off,          // N: element offset of each sample's output
    const int* __restrict__ first_block,            // N: first block of each sample
    int n, const float* __restrict__ norm,          // 9: mul[3], add[3] (out = v * mul + add), fill[3]
    T* __restrict__ out)
{
    const int s = find_sample(first_block, n, blockIdx.x);
    const int oh = out_shape[2 * s], ow = out_shape[2 * s + 1];
    const int pix = (blockIdx.x - first_block[s]) * blockDim.x + threadIdx.x;
    if (pix >= oh * ow) return;
    const int oy = pix / ow, ox = pix - oy * ow;
    const int ih = in_shape[3 * s], iw = in_shape[3 * s + 1], stride = in_shape[3 * s + 2];
    const unsigned char* __restrict__ src = reinterpret_cast<const unsigned char*>(in_ptr[s]);
    const Geo g = geo[s];
    const float cy = g.ay + g.by * (oy + 0.5f);
    const float cx = g.ax + g.bx * (ox + 0.5f);
    float acc0 = norm[6], acc1 = norm[7], acc2 = norm[8];  // the fill, unless the centre is inside
    if (cy >= 0.f && cy < (float)ih && cx >= 0.f && cx < (float)iw) {
        const float ry = fmaxf(fabsf(g.by), 1.f), rx = fmaxf(fabsf(g.bx), 1.f);
        // Pillow: taps [int(c - r + 0.5), int(c + r + 0.5)), weight tri((t + 0.5 - c) / r)
        const int y0 = max((int)floorf(cy - ry + 0.5f), 0), y1 = min((int)floorf(cy + ry + 0.5f), ih);
        const int x0 = max((int)floorf(cx - rx + 0.5f), 0), x1 = min((int)floorf(cx + rx + 0.5f), iw);
        const float iry = 1.f / ry, irx = 1.f / rx;
        acc0 = acc1 = acc2 = 0.f;
        float wx_sum = 0.f;
        for (int x = x0; x < x1; ++x) wx_sum += fmaxf(0.f, 1.f - fabsf((x + 0.5f - cx) * irx));
        float wy_sum = 0.f;
        for (int y = y0; y < y1; ++y) {
            const float wy = fmaxf(0.f, 1.f - fabsf((y + 0.5f - cy) * iry));
            if (wy == 0.f) continue;
            wy_sum += wy;
            const unsigned char* row = src + (long long)y * stride;
            float r0 = 0.f, r1 = 0.f, r2 = 0.f;
            for (int x = x0; x < x1; ++x) {
                const float wx = fmaxf(0.f, 1.f - fabsf((x + 0.5f - cx) * irx));
                const unsigned char* p = row + 3 * x;
                r0 = fmaf(wx, (float)__ldg(p), r0);
                r1 = fmaf(wx, (float)__ldg(p + 1), r1);
                r2 = fmaf(wx, (float)__ldg(p + 2), r2);
            }
            acc0 = fmaf(wy, r0, acc0);
            acc1 = fmaf(wy, r1, acc1);
            acc2 = fmaf(wy, r2, acc2);
        }
        const float inv = 1.f / fmaxf(wy_sum * wx_sum, 1e-20f);
        acc0 *= inv; acc1 *= inv; acc2 *= inv;
    }
    acc0 = fmaf(acc0, norm[0], norm[3]);
    acc1 = fmaf(acc1, norm[1], norm[4]);
    acc2 = fmaf(acc2, norm[2], norm[5]);
    T* o = out + out_off[s];
    if (CHW) {
        const int plane = oh * ow;
        o[pix] = cvt<T>(acc0);
        o[plane + pix] = cvt<T>(acc1);
        o[2 * plane + pix] = cvt<T>(acc2);
    } else {
        o[3 * pix] = cvt<T>(acc0);
        o[3 * pix + 1] = cvt<T>(acc1);
        o[3 * pix + 2] = cvt<T>(acc2);
    }
}

#define RESAMPLE_KERNEL(NAME, T, CHW)                                                                   \
    extern "C" __global__ void NAME(const unsigned long long* in_ptr, const int* in_shape, const Geo* geo, \
                                    const int* out_shape, const long long* out_off, const int* first_block, \
                                    int n, const float* norm, T* out) {                                 \
        resample_impl<T, CHW>(in_ptr, in_shape, geo, out_shape, out_off, first_block, n, norm, out);    \
    }

RESAMPLE_KERNEL(resample_u8_hwc, unsigned char, false)
RESAMPLE_KERNEL(resample_u8_chw, unsigned char, true)
RESAMPLE_KERNEL(resample_f16_hwc, __half, false)
RESAMPLE_KERNEL(resample_f16_chw, __half, true)
RESAMPLE_KERNEL(resample_f32_hwc, float, false)
RESAMPLE_KERNEL(resample_f32_chw, float, true)
