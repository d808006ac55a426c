// Helpers shared by gpubatch's kernels over ragged batches.
//
// Blocks are laid out flat over a batch; a block finds its sample by binary search over the
// first_block prefix table (DALI's slice kernels do the same), so small and large samples share a grid.
#pragma once

// The last s in [0, n) with start[s] <= v (start ascending): the sample (block table) or row (offset
// table, 64-bit for audio's samples) that v falls in.
template <typename T>
__device__ __forceinline__ int last_at_most(const T* __restrict__ start, int n, T v) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (start[mid] <= v) lo = mid; else hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ int find_sample(const int* __restrict__ first_block, int n, int block) {
    return last_at_most(first_block, n, block);
}

__device__ __forceinline__ unsigned char to_u8(float v) {
    return (unsigned char)fminf(fmaxf(rintf(v), 0.f), 255.f);
}

// PCG output hash: the counter-based random stream of image NOISE, random ERASE and audio noise
// (NumPy twin: ops/pixel.py _pcg). unit() maps (seed, index) to a float in (0, 1).
__device__ __forceinline__ unsigned int pcg(unsigned int v) {
    unsigned int state = v * 747796405u + 2891336453u;
    unsigned int word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

__device__ __forceinline__ float unit(unsigned int seed, unsigned int idx) {
    return ((pcg(seed ^ pcg(idx)) >> 8) + 0.5f) * (1.f / 16777216.f);
}
