// Batched baseline JPEG encode (4:2:0, Huffman tables given): one launch per stage for a whole ragged batch.
//
// Blocks are numbered over the batch in scan order: image by image, MCU by MCU (16x16 pixels,
// row-major), and within an MCU Y00 Y01 Y10 Y11 Cb Cr. mcu_first[i] is image i's first MCU (n + 1
// entries), so block t belongs to image find_sample(mcu_first, n, t / 6).
//
//   jpeg_dct    eight threads per 8x8 block: RGB -> YCbCr (chroma averaged over 2x2), level shift,
//               2-D DCT-II, quantize, zigzag -> coef[t * 64 + k]
//   jpeg_bits   one thread per block: the length in bits of its Huffman-coded data (DC difference
//               to the previous block of its component, AC run lengths, EOB)
//   scan_tile, scan_tiles
//               an inclusive scan of those lengths over the batch (below)
//   jpeg_layout one block: each image's length in bytes, its first byte (an exclusive scan: the
//               images back to back) and the bit its first block starts at
//   jpeg_pack   one thread per block: writes its bits at its bit offset (each image starting on a
//               byte) into a zeroed word buffer; the words a block shares with its neighbours are
//               OR-ed atomically, the others stored; the last block of an image pads its final byte
//               with 1-bits.
//   scan_tile, scan_tiles
//               an inclusive scan of the 0xFF bytes of that buffer
//   jpeg_stuff  one thread per byte: the byte at its place once a 0x00 follows every 0xFF before
//               it (byte stuffing), and where each image's data ends then
// The headers are written by the caller.
//
// A scan over N values takes two launches: scan_tile (a tile of SCAN_TILE values a thread block: the
// tile's own inclusive scan, and its sum) and scan_tiles (one thread block: the tiles' sums turned into
// each tile's offset). A value's scan is then part[i] + tile_off[i / SCAN_TILE] (scanned()), read by the
// kernels that need it: no third pass over the values.
#include "common.cuh"

#define SCAN_TILE 1024

// The inclusive scan of v over the thread block (SCAN_TILE threads), through warp shuffles and ``sh``
// (32 values of shared memory); safe to call again at once.
__device__ __forceinline__ long long block_scan(long long v, long long* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const long long x = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += x;
    }
    if (lane == 31) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        long long w = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const long long x = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += x;
        }
        sh[lane] = w;
    }
    __syncthreads();
    if (warp > 0) v += sh[warp - 1];
    __syncthreads();
    return v;
}

__device__ __forceinline__ long long scanned(const long long* __restrict__ part, const long long* __restrict__ tile_off,
                                             long long i) {
    return part[i] + tile_off[i / SCAN_TILE];
}

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

#ifdef KEEP_jpeg_dct
#define DCT_THREADS 128  // a thread block's threads (jpeg_gpu.BLOCK): 16 8x8 blocks
// natural (row-major) index of an 8x8 block -> its zigzag position
__constant__ unsigned char kZigzag[64] = {
    0, 1, 5, 6, 14, 15, 27, 28, 2, 4, 7, 13, 16, 26, 29, 42, 3, 8, 12, 17, 25, 30, 41, 43, 9, 11, 18, 24, 31, 40,
    44, 53, 10, 19, 23, 32, 39, 45, 52, 54, 20, 22, 33, 38, 46, 51, 55, 60, 21, 34, 37, 47, 50, 56, 59, 61, 35, 36,
    48, 49, 57, 58, 62, 63};

// Eight threads an 8x8 block (eight lanes of one warp): thread r loads row r and transforms it (the row
// pass) into shared memory, then transforms column r (the column pass), quantizes it and writes its eight
// coefficients at their zigzag places. Each coefficient is the same sums, in the same order, as when one
// thread did a whole block with it in its registers: unrolled, this file took NVRTC 2.8-3.3 s (H200 host,
// 2026-12-03; on a machine with no compiled kernels yet, the largest part of a GPU run's start), and rolled
// it needed 576 bytes of stack a thread (local memory the driver holds for every thread the GPU can run at
// once: 132 SMs x 2,048 x 576 bytes, about 150 MiB on an H200).
extern "C" __global__ void jpeg_dct(const unsigned long long* __restrict__ ptr, const int* __restrict__ shape,
                                    const int* __restrict__ mcu_first, int n, int total_blocks,
                                    const float* __restrict__ qtab,     // [2][64] zigzag order
                                    const float* __restrict__ cosines,  // [8][8]: C(u)/2 cos((2x+1)u pi/16)
                                    short* __restrict__ coef) {
    __shared__ float rows[DCT_THREADS / 8][8][9];  // [block of the thread block][y][u] (9: no bank conflicts)
    const int t = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 3), r = threadIdx.x & 7;
    float (*tmp)[9] = rows[threadIdx.x >> 3];
    const bool live = t < total_blocks;
    int j = 0;
    if (live) {
        int mcu = t / 6;
        j = t % 6;
        int i = find_sample(mcu_first, n, mcu);
        const unsigned char* img = (const unsigned char*)ptr[i];
        int h = shape[3 * i], w = shape[3 * i + 1], stride = shape[3 * i + 2];
        int cols = (w + 15) >> 4;
        int m = mcu - mcu_first[i];
        int y0 = (m / cols) * 16, x0 = (m % cols) * 16;
        float f[8];  // row r of the block
        if (j < 4) {
            y0 += (j >> 1) * 8;
            x0 += (j & 1) * 8;
            const unsigned char* row = img + (size_t)min(y0 + r, h - 1) * stride;
#pragma unroll
            for (int x = 0; x < 8; ++x) {
                const unsigned char* p = row + 3 * min(x0 + x, w - 1);
                f[x] = 0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2] - 128.f;
            }
        } else {
            bool cb = j == 4;
            const unsigned char* r0 = img + (size_t)min(y0 + 2 * r, h - 1) * stride;
            const unsigned char* r1 = img + (size_t)min(y0 + 2 * r + 1, h - 1) * stride;
#pragma unroll
            for (int x = 0; x < 8; ++x) {
                int xa = 3 * min(x0 + 2 * x, w - 1), xb = 3 * min(x0 + 2 * x + 1, w - 1);
                float rr = (float)r0[xa] + r0[xb] + r1[xa] + r1[xb];
                float g = (float)r0[xa + 1] + r0[xb + 1] + r1[xa + 1] + r1[xb + 1];
                float b = (float)r0[xa + 2] + r0[xb + 2] + r1[xa + 2] + r1[xb + 2];
                f[x] = 0.25f * (cb ? (-0.168736f * rr - 0.331264f * g + 0.5f * b)
                                   : (0.5f * rr - 0.418688f * g - 0.081312f * b));
            }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {  // the row pass: tmp[r][u] = sum_x c[u][x] f[r][x]
            float s = 0.f;
#pragma unroll
            for (int x = 0; x < 8; ++x) s += cosines[u * 8 + x] * f[x];
            tmp[r][u] = s;
        }
    }
    __syncwarp();
    if (!live) return;
    const float* q = qtab + (j < 4 ? 0 : 64);
    short* out = coef + (size_t)t * 64;
#pragma unroll
    for (int v = 0; v < 8; ++v) {  // the column pass on column r: F[v][r] = sum_y c[v][y] tmp[y][r]
        float s = 0.f;
#pragma unroll
        for (int y = 0; y < 8; ++y) s += cosines[v * 8 + y] * tmp[y][r];
        const int k = kZigzag[v * 8 + r];
        const float val = s / q[k];
        out[k] = (short)(val >= 0.f ? floorf(val + 0.5f) : -floorf(0.5f - val));
    }
}
#endif

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

#ifdef KEEP_jpeg_bits
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
#endif

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

#ifdef KEEP_jpeg_pack
extern "C" __global__ void jpeg_pack(const short* __restrict__ coef, const int* __restrict__ mcu_first, int n,
                                     int total_blocks, const HuffTables* __restrict__ tab,
                                     const long long* __restrict__ nbits,
                                     const long long* __restrict__ part,     // the scan of nbits (scanned())
                                     const long long* __restrict__ tile_off,
                                     const long long* __restrict__ bit_base, // per image: its first bit - the scan before its first block
                                     unsigned int* __restrict__ words) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total_blocks) return;
    int i = block_image(mcu_first, n, t);
    int c = t % 6 < 4 ? 0 : 1;
    const short* b = coef + (size_t)t * 64;
    BitWriter out(words, bit_base[i] + scanned(part, tile_off, t) - nbits[t]);
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
#endif

#ifdef KEEP_scan_tile
// The inclusive scan of each tile of values (nbits, or 0xFF bytes where ``ff``) into ``part``, and each
// tile's sum into ``tile_sum``.
extern "C" __global__ void scan_tile(const void* __restrict__ in, int ff, long long n, long long* __restrict__ part,
                                     long long* __restrict__ tile_sum) {
    __shared__ long long sh[32];
    const long long i = (long long)blockIdx.x * SCAN_TILE + threadIdx.x;
    long long v = 0;
    if (i < n) v = ff ? (long long)(((const unsigned char*)in)[i] == 0xFF) : ((const long long*)in)[i];
    v = block_scan(v, sh);
    if (i < n) part[i] = v;
    if (threadIdx.x == SCAN_TILE - 1) tile_sum[blockIdx.x] = v;
}
#endif

#ifdef KEEP_scan_tiles
// One thread block: the tiles' sums, in place, turned into the sum of the tiles before each (a tile's offset).
extern "C" __global__ void scan_tiles(long long* __restrict__ tile_sum, long long tiles) {
    __shared__ long long sh[32];
    __shared__ long long carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (long long first = 0; first < tiles; first += SCAN_TILE) {
        const long long i = first + threadIdx.x;
        const long long v = i < tiles ? tile_sum[i] : 0;
        const long long s = block_scan(v, sh);
        const long long c = carry;
        if (i < tiles) tile_sum[i] = c + s - v;
        __syncthreads();
        if (threadIdx.x == SCAN_TILE - 1) carry = c + s;
        __syncthreads();
    }
}
#endif

#ifdef KEEP_jpeg_layout
// One thread block over the n images: image i's first byte base[i] (base[n]: the bytes of them all) and
// the bit its first block starts at less the scan before that block, bit_base[i].
extern "C" __global__ void jpeg_layout(const int* __restrict__ mcu_first, int n, const long long* __restrict__ nbits,
                                       const long long* __restrict__ part, const long long* __restrict__ tile_off,
                                       long long* __restrict__ base, long long* __restrict__ bit_base) {
    __shared__ long long sh[32];
    __shared__ long long carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int first = 0; first < n; first += SCAN_TILE) {
        const int i = first + threadIdx.x;
        long long bytes = 0, before = 0;
        if (i < n) {
            const long long t0 = (long long)mcu_first[i] * 6, t1 = (long long)mcu_first[i + 1] * 6 - 1;
            before = scanned(part, tile_off, t0) - nbits[t0];  // the bits of the images before it
            bytes = (scanned(part, tile_off, t1) - before + 7) >> 3;
        }
        const long long s = block_scan(bytes, sh);
        const long long c = carry;
        if (i < n) {
            base[i] = c + s - bytes;
            bit_base[i] = (c + s - bytes) * 8 - before;
        }
        if (i == n - 1) base[n] = c + s;
        __syncthreads();
        if (threadIdx.x == SCAN_TILE - 1) carry = c + s;
        __syncthreads();
    }
}
#endif

#ifdef KEEP_jpeg_stuff
// Threads [0, total): byte i of ``raw`` to its place in ``out`` with a 0x00 after it where it is 0xFF
// (``part``/``tile_off``: the scan of the 0xFF bytes); threads [total, total + n]: ends[j], where the data
// of image j starts in ``out`` (ends[n]: its length), from base[j], its start in ``raw``.
extern "C" __global__ void jpeg_stuff(const unsigned char* __restrict__ raw, long long total,
                                      const long long* __restrict__ part, const long long* __restrict__ tile_off,
                                      const long long* __restrict__ base, int n, unsigned char* __restrict__ out,
                                      long long* __restrict__ ends) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        const unsigned char b = raw[i];
        const long long at = i + scanned(part, tile_off, i) - (b == 0xFF);  // (the 0xFF bytes before it)
        out[at] = b;
        if (b == 0xFF) out[at + 1] = 0;
    } else if (i <= total + n) {
        const long long j = i - total, b = base[j];
        ends[j] = b + (b > 0 ? scanned(part, tile_off, b - 1) : 0);
    }
}
#endif

