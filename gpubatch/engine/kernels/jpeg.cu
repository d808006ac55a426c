// Batched baseline JPEG encode (4:2:0, Huffman tables given): one launch per stage for a whole ragged batch.
//
// Blocks are numbered over the batch in scan order: image by image, MCU by MCU (16x16 pixels,
// row-major), and within an MCU Y00 Y01 Y10 Y11 Cb Cr. mcu_first[i] is image i's first MCU (n + 1
// entries), so block t belongs to image find_sample(mcu_first, n, t / 6).
//
//   jpeg_dct    one thread per 8x8 block: RGB -> YCbCr (chroma averaged over 2x2), level shift,
//               2-D DCT-II, quantize, zigzag -> coef[t * 64 + k]
//   jpeg_bits   one thread per block: the length in bits of its Huffman-coded data (DC difference
//               to the previous block of its component, AC run lengths, EOB)
//   jpeg_pack   one thread per block: writes those bits at the block's bit offset (an exclusive scan
//               of the lengths, each image starting on a byte) into a zeroed word buffer; the words a
//               block shares with its neighbours are OR-ed atomically, the others stored; the last
//               block of an image pads its final byte with 1-bits.
// Byte stuffing (0x00 after each 0xFF) and the headers are done by the caller.
#include "common.cuh"

struct HuffTables {
    // [table][symbol]: code and length; table 0 luminance, 1 chrominance
    unsigned int dc_code[2][16];
    unsigned int dc_len[2][16];
    unsigned int ac_code[2][256];
    unsigned int ac_len[2][256];
};

__device__ __forceinline__ int block_image(const int* __restrict__ mcu_first, int n, int t) {
    return find_sample(mcu_first, n, t / 6);
}

extern "C" __global__ void jpeg_dct(const unsigned long long* __restrict__ ptr, const int* __restrict__ shape,
                                    const int* __restrict__ mcu_first, int n, int total_blocks,
                                    const float* __restrict__ qtab,     // [2][64] zigzag order
                                    const float* __restrict__ cosines,  // [8][8]: C(u)/2 cos((2x+1)u pi/16)
                                    short* __restrict__ coef) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total_blocks) return;
    int mcu = t / 6, j = t % 6;
    int i = find_sample(mcu_first, n, mcu);
    const unsigned char* img = (const unsigned char*)ptr[i];
    int h = shape[3 * i], w = shape[3 * i + 1], stride = shape[3 * i + 2];
    int cols = (w + 15) >> 4;
    int m = mcu - mcu_first[i];
    int y0 = (m / cols) * 16, x0 = (m % cols) * 16;
    float f[64];
    if (j < 4) {
        y0 += (j >> 1) * 8;
        x0 += (j & 1) * 8;
#pragma unroll
        for (int y = 0; y < 8; ++y) {
            const unsigned char* row = img + (size_t)min(y0 + y, h - 1) * stride;
            for (int x = 0; x < 8; ++x) {
                const unsigned char* p = row + 3 * min(x0 + x, w - 1);
                f[y * 8 + x] = 0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2] - 128.f;
            }
        }
    } else {
        bool cb = j == 4;
#pragma unroll
        for (int y = 0; y < 8; ++y) {
            const unsigned char* r0 = img + (size_t)min(y0 + 2 * y, h - 1) * stride;
            const unsigned char* r1 = img + (size_t)min(y0 + 2 * y + 1, h - 1) * stride;
            for (int x = 0; x < 8; ++x) {
                int xa = 3 * min(x0 + 2 * x, w - 1), xb = 3 * min(x0 + 2 * x + 1, w - 1);
                float r = (float)r0[xa] + r0[xb] + r1[xa] + r1[xb];
                float g = (float)r0[xa + 1] + r0[xb + 1] + r1[xa + 1] + r1[xb + 1];
                float b = (float)r0[xa + 2] + r0[xb + 2] + r1[xa + 2] + r1[xb + 2];
                f[y * 8 + x] = 0.25f * (cb ? (-0.168736f * r - 0.331264f * g + 0.5f * b)
                                           : (0.5f * r - 0.418688f * g - 0.081312f * b));
            }
        }
    }
    float tmp[64];
#pragma unroll
    for (int y = 0; y < 8; ++y)  // rows: tmp[y][u] = sum_x c[u][x] f[y][x]
        for (int u = 0; u < 8; ++u) {
            float s = 0.f;
            for (int x = 0; x < 8; ++x) s += cosines[u * 8 + x] * f[y * 8 + x];
            tmp[y * 8 + u] = s;
        }
#pragma unroll
    for (int v = 0; v < 8; ++v)  // columns: f[v][u] = sum_y c[v][y] tmp[y][u]
        for (int u = 0; u < 8; ++u) {
            float s = 0.f;
            for (int y = 0; y < 8; ++y) s += cosines[v * 8 + y] * tmp[y * 8 + u];
            f[v * 8 + u] = s;
        }
    // zigzag position -> natural (row-major) index of an 8x8 block
    constexpr unsigned char kNatural[64] = {
        0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21,
        28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61,
        54, 47, 55, 62, 63};
    const float* q = qtab + (j < 4 ? 0 : 64);
    short* out = coef + (size_t)t * 64;
#pragma unroll
    for (int k = 0; k < 64; ++k) {  // unrolled: f stays in registers
        float v = f[kNatural[k]] / q[k];
        out[k] = (short)(v >= 0.f ? floorf(v + 0.5f) : -floorf(0.5f - v));
    }
}

__device__ __forceinline__ int category(int v) {
    unsigned int a = v < 0 ? -v : v;
    return a ? 32 - __clz(a) : 0;
}

// The DC predictor of block t: the previous block of its component in the image, or none (0).
__device__ __forceinline__ int dc_pred(const short* __restrict__ coef, int t, int first) {
    int j = t % 6;
    int prev = j >= 1 && j <= 3 ? t - 1 : (j == 0 ? t - 3 : t - 6);
    return prev >= first ? coef[(size_t)prev * 64] : 0;
}

extern "C" __global__ void jpeg_bits(const short* __restrict__ coef, const int* __restrict__ mcu_first, int n,
                                     int total_blocks, const HuffTables* __restrict__ tab,
                                     long long* __restrict__ nbits) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total_blocks) return;
    int i = block_image(mcu_first, n, t);
    int c = t % 6 < 4 ? 0 : 1;
    const short* b = coef + (size_t)t * 64;
    int cat = category(b[0] - dc_pred(coef, t, mcu_first[i] * 6));
    long long bits = tab->dc_len[c][cat] + cat;
    int run = 0;
    for (int k = 1; k < 64; ++k) {
        int v = b[k];
        if (v == 0) { ++run; continue; }
        for (; run > 15; run -= 16) bits += tab->ac_len[c][0xF0];
        int s = category(v);
        bits += tab->ac_len[c][(run << 4) | s] + s;
        run = 0;
    }
    if (run) bits += tab->ac_len[c][0];
    nbits[t] = bits;
}

__device__ __forceinline__ unsigned int bswap32(unsigned int x) { return __byte_perm(x, 0, 0x0123); }

struct BitWriter {
    unsigned int* words;
    long long word;         // index of the word being filled
    unsigned long long acc; // bits not yet written, left-aligned
    int n;                  // bits in acc
    bool first;             // the word being filled may hold the previous block's bits

    __device__ BitWriter(unsigned int* w, long long bitpos)
        : words(w), word(bitpos >> 5), acc(0), n((int)(bitpos & 31)), first(true) {}

    __device__ __forceinline__ void put(unsigned int val, int len) {  // len <= 27
        if (!len) return;
        acc |= (unsigned long long)val << (64 - n - len);
        n += len;
        if (n >= 32) {
            unsigned int hi = bswap32((unsigned int)(acc >> 32));
            if (first) atomicOr(words + word, hi); else words[word] = hi;
            first = false;
            ++word;
            acc <<= 32;
            n -= 32;
        }
    }

    __device__ __forceinline__ void flush() {  // the last word is shared with the next block
        if (n) atomicOr(words + word, bswap32((unsigned int)(acc >> 32)));
    }
};

extern "C" __global__ void jpeg_pack(const short* __restrict__ coef, const int* __restrict__ mcu_first, int n,
                                     int total_blocks, const HuffTables* __restrict__ tab,
                                     const long long* __restrict__ start,    // exclusive scan of nbits
                                     const long long* __restrict__ bit_base, // per image: its first bit - start[first block]
                                     unsigned int* __restrict__ words) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total_blocks) return;
    int i = block_image(mcu_first, n, t);
    int c = t % 6 < 4 ? 0 : 1;
    const short* b = coef + (size_t)t * 64;
    BitWriter out(words, bit_base[i] + start[t]);
    int diff = b[0] - dc_pred(coef, t, mcu_first[i] * 6);
    int cat = category(diff);
    out.put(tab->dc_code[c][cat], tab->dc_len[c][cat]);
    out.put((diff < 0 ? diff - 1 : diff) & ((1u << cat) - 1), cat);
    int run = 0;
    for (int k = 1; k < 64; ++k) {
        int v = b[k];
        if (v == 0) { ++run; continue; }
        for (; run > 15; run -= 16) out.put(tab->ac_code[c][0xF0], tab->ac_len[c][0xF0]);
        int s = category(v);
        int sym = (run << 4) | s;
        out.put(tab->ac_code[c][sym], tab->ac_len[c][sym]);
        out.put((v < 0 ? v - 1 : v) & ((1u << s) - 1), s);
        run = 0;
    }
    if (run) out.put(tab->ac_code[c][0], tab->ac_len[c][0]);
    if (t + 1 == mcu_first[i + 1] * 6) {  // the image's last block: fill its last byte with 1-bits
        int pad = (8 - (out.n & 7)) & 7;
        out.put((1u << pad) - 1, pad);
    }
    out.flush();
}
