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

// An image decoded into the JPEG's own planes (codecs/planes.py): the Y plane (rows of ``pitch``
// bytes), then the Cb and then the Cr plane (rows of the chroma width), chroma sampled 2x2 (format
// 1, 4:2:0) or 2x1 (format 2, 4:2:2). A pixel is read as libjpeg makes it: "fancy" upsampling (3/4
// of the nearer chroma sample, 1/4 of the next, per subsampled axis, in integers with libjpeg's
// rounding; jdsample.c), then YCbCr -> RGB in 16-bit fixed point (jdcolor.c), so the resample sees
// the pixels Pillow decodes.
struct Planes {
    const unsigned char* y;
    const unsigned char* cb;
    const unsigned char* cr;
    int pitch, cw, ch, fmt;

    __device__ Planes(const unsigned char* base, int ih, int iw, int stride, int f) : y(base), pitch(stride), fmt(f) {
        cw = (iw + 1) >> 1;
        ch = f == 1 ? (ih + 1) >> 1 : ih;
        cb = base + (long long)stride * ih;
        cr = cb + (long long)cw * ch;
    }

    // 3 x the nearer chroma row's sample of column i plus the next row over's (4 x the row's own for
    // 4:2:2, whose "next row" is itself): libjpeg's column sum, 4x the vertically upsampled value
    __device__ __forceinline__ int colsum(const unsigned char* nr, const unsigned char* fr, int i) const {
        i = min(max(i, 0), cw - 1);
        return 3 * __ldg(nr + i) + __ldg(fr + i);
    }

    // Luma row ``yy``'s pixels x0 .. x1-1 as RGB, each weighted by the triangle tap (x + 0.5 - cx) /
    // rx (``irx`` = 1 / rx) and summed into s0, s1, s2. The column sums of the chroma columns around the
    // current one are kept as x advances (two new loads a plane every second pixel).
    __device__ __forceinline__ void taps(int yy, int x0, int x1, float cx, float irx, float& s0, float& s1,
                                         float& s2) const {
        int near = yy, far = yy;
        if (fmt == 1) {
            near = yy >> 1;
            far = min(max((yy & 1) ? near + 1 : near - 1, 0), ch - 1);
        }
        const unsigned char* lum = y + (long long)yy * pitch;
        const unsigned char *bn = cb + (long long)near * cw, *bf = cb + (long long)far * cw;
        const unsigned char *rn = cr + (long long)near * cw, *rf = cr + (long long)far * cw;
        const bool fancy = cw > 2;  // libjpeg repeats the samples of planes this narrow
        const int even_bias = fmt == 1 ? 8 : 4, odd_bias = fmt == 1 ? 7 : 8;  // libjpeg's, in 16ths
        int i = x0 >> 1;
        int bp = colsum(bn, bf, i - 1), bc = colsum(bn, bf, i), bx = colsum(bn, bf, i + 1);
        int rp = colsum(rn, rf, i - 1), rc = colsum(rn, rf, i), rx = colsum(rn, rf, i + 1);
        for (int x = x0; x < x1; ++x) {
            if ((x >> 1) != i) {
                ++i;
                bp = bc; bc = bx; bx = colsum(bn, bf, i + 1);
                rp = rc; rc = rx; rx = colsum(rn, rf, i + 1);
            }
            int u, v;
            if (!fancy) {
                u = __ldg(bn + i);
                v = __ldg(rn + i);
            } else if (x & 1) {
                u = (3 * bc + bx + odd_bias) >> 4;
                v = (3 * rc + rx + odd_bias) >> 4;
            } else {
                u = (3 * bc + bp + even_bias) >> 4;
                v = (3 * rc + rp + even_bias) >> 4;
            }
            u -= 128;
            v -= 128;
            const int l = __ldg(lum + x);
            const float w = fmaxf(0.f, 1.f - fabsf((x + 0.5f - cx) * irx));
            s0 = fmaf(w, (float)min(max(l + ((91881 * v + 32768) >> 16), 0), 255), s0);
            s1 = fmaf(w, (float)min(max(l + ((-22554 * u + 32768 - 46802 * v) >> 16), 0), 255), s1);
            s2 = fmaf(w, (float)min(max(l + ((116130 * u + 32768) >> 16), 0), 255), s2);
        }
    }
};

template <typename T, bool CHW, bool PLANES>
__device__ void resample_impl(
    const unsigned long long* __restrict__ in_ptr,  // N: base address of each uint8 HWC RGB image
    const int* __restrict__ in_shape,               // N x 3: height, width, row stride in bytes (PLANES:
                                                    // N x 4, then the format: 0 RGB, 1/2 Planes)
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
    const int cols = PLANES ? 4 : 3;
    const int ih = in_shape[cols * s], iw = in_shape[cols * s + 1], stride = in_shape[cols * s + 2];
    const int fmt = PLANES ? in_shape[cols * s + 3] : 0;
    const unsigned char* __restrict__ src = reinterpret_cast<const unsigned char*>(in_ptr[s]);
    const Geo g = geo[s];
    const float cy = g.ay + g.by * (oy + 0.5f);
    const float cx = g.ax + g.bx * (ox + 0.5f);
    const Planes pl(src, ih, iw, stride, fmt);  // (read only where fmt says planes)
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
            float r0 = 0.f, r1 = 0.f, r2 = 0.f;
            if (PLANES && fmt) {
                pl.taps(y, x0, x1, cx, irx, r0, r1, r2);
            } else {
                const unsigned char* row = src + (long long)y * stride;
                for (int x = x0; x < x1; ++x) {
                    const float wx = fmaxf(0.f, 1.f - fabsf((x + 0.5f - cx) * irx));
                    const unsigned char* p = row + 3 * x;
                    r0 = fmaf(wx, (float)__ldg(p), r0);
                    r1 = fmaf(wx, (float)__ldg(p + 1), r1);
                    r2 = fmaf(wx, (float)__ldg(p + 2), r2);
                }
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

#define RESAMPLE_KERNEL(NAME, T, CHW, PLANES)                                                           \
    extern "C" __global__ void NAME(const unsigned long long* in_ptr, const int* in_shape, const Geo* geo, \
                                    const int* out_shape, const long long* out_off, const int* first_block, \
                                    int n, const float* norm, T* out) {                                 \
        resample_impl<T, CHW, PLANES>(in_ptr, in_shape, geo, out_shape, out_off, first_block, n, norm, out); \
    }

#ifdef KEEP_resample_u8_hwc
RESAMPLE_KERNEL(resample_u8_hwc, unsigned char, false, false)
#endif
#ifdef KEEP_resample_u8_chw
RESAMPLE_KERNEL(resample_u8_chw, unsigned char, true, false)
#endif
#ifdef KEEP_resample_f16_hwc
RESAMPLE_KERNEL(resample_f16_hwc, __half, false, false)
#endif
#ifdef KEEP_resample_f16_chw
RESAMPLE_KERNEL(resample_f16_chw, __half, true, false)
#endif
#ifdef KEEP_resample_f32_hwc
RESAMPLE_KERNEL(resample_f32_hwc, float, false, false)
#endif
#ifdef KEEP_resample_f32_chw
RESAMPLE_KERNEL(resample_f32_chw, float, true, false)
#endif
// sources that may hold images in planes (in_shape N x 4)
#ifdef KEEP_resample_u8_hwc_planes
RESAMPLE_KERNEL(resample_u8_hwc_planes, unsigned char, false, true)
#endif
#ifdef KEEP_resample_u8_chw_planes
RESAMPLE_KERNEL(resample_u8_chw_planes, unsigned char, true, true)
#endif
#ifdef KEEP_resample_f16_hwc_planes
RESAMPLE_KERNEL(resample_f16_hwc_planes, __half, false, true)
#endif
#ifdef KEEP_resample_f16_chw_planes
RESAMPLE_KERNEL(resample_f16_chw_planes, __half, true, true)
#endif
#ifdef KEEP_resample_f32_hwc_planes
RESAMPLE_KERNEL(resample_f32_hwc_planes, float, false, true)
#endif
#ifdef KEEP_resample_f32_chw_planes
RESAMPLE_KERNEL(resample_f32_chw_planes, float, true, true)
#endif
