// Helpers shared by gpubatch's kernels over ragged batches.
//
// Blocks are laid out flat over a batch; a block finds its sample by binary search over the
// first_block prefix table (DALI's slice kernels do the same), so small and large samples share a grid.
#pragma once

__device__ __forceinline__ int find_sample(const int* __restrict__ first_block, int n, int block) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {  // last s with first_block[s] <= block
        int mid = (lo + hi + 1) >> 1;
        if (first_block[mid] <= block) lo = mid; else hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ unsigned char to_u8(float v) {
    return (unsigned char)fminf(fmaxf(rintf(v), 0.f), 255.f);
}
