// FLAC frames decoded on the GPU: one thread a frame (a frame's subframes are one bit stream, read in
// order; frames are independent), each sample predicted as its residual is read (the history in registers)
// and written once, as float32 exactly as libsndfile gives it (x * 2^-(bps-1): exact for bps <= 24). The host (codecs/flac_gpu.py) finds each frame's start from
// the stream's headers; the thread checks everything it reads (the header's CRC-8, the frame's CRC-16,
// that the frame ends where the next begins, its block size, channels and depth) and writes a status:
// a record with any frame not 0 is decoded again on the CPU, as the CPU path would.
//
// The decode itself is also compiled as C++ on the host (FLAC_HOST defined), where the tests run it
// frame by frame against libsndfile.
//
// A warp's 32 threads decode 32 frames whose subframes differ (FIXED or LPC, their orders, their partitions' sizes),
// and every branch they take apart runs in turn. So every kind of prediction is one code path (FIXED as LPC with its
// binomial taps) and the partitions are one loop over the samples: on an H100 a launch of 64 clips' 2,560 frames
// took 2.9 ms this way against 12.5 ms with a template a kind and a loop a partition (2026-12-06, benchmarks/RESULTS.md).
#ifdef FLAC_HOST
#define FLAC_DEV static inline
typedef unsigned long long u64;
#else
#define FLAC_DEV __device__ __forceinline__
typedef unsigned long long u64;
#endif

// per-frame table (int64 each): byte start, byte end (the next frame's start; a last frame may end
// before it), output base (float index of channel 0's first sample of the record), first sample of
// the frame in the record, the block size expected, channel stride (samples a channel in the output),
// flags: channels | bps << 8 | last << 16. Every frame is decoded whole (a record's output holds its
// decoded frames' samples; the host cuts a record asked for fewer); "last" is the stream's last frame,
// which may end before the bytes given (a tag after it).
#define FLAC_COLS 7

// status codes: 0 decoded
#define FLAC_E_HEADER 1
#define FLAC_E_CRC8 2
#define FLAC_E_SUBFRAME 3
#define FLAC_E_RESIDUAL 4
#define FLAC_E_CRC16 5
#define FLAC_E_END 6
#define FLAC_E_SHAPE 7
#define FLAC_E_OVERRUN 8

struct FlacBits {
    const unsigned char* buf;  // (on the GPU 4-byte aligned, with 16 bytes to read past its last frame)
    long long byte;  // next byte to load
    long long limit; // bytes at and past this are not loaded (a frame that reads past it is refused: fb_over)
    u64 cache;       // MSB-aligned; its bits past n are 0
    int n;           // valid bits in cache
    unsigned int ahead;  // the word at byte, loaded one refill early (its load's latency behind the decode)
};

FLAC_DEV unsigned int load_be32(const unsigned char* buf, long long pos);

FLAC_DEV void fb_start(FlacBits& b, const unsigned char* buf, long long byte, long long limit) {
    b.buf = buf; b.byte = byte; b.limit = limit; b.cache = 0; b.n = 0;
    b.ahead = byte < limit ? load_be32(buf, byte) : 0u;
}

// Four bytes from pos, big-endian (on the GPU: two aligned words and a funnel shift, read through the
// read-only cache)
FLAC_DEV unsigned int load_be32(const unsigned char* buf, long long pos) {
#ifdef FLAC_HOST
    return (unsigned int)buf[pos] << 24 | (unsigned int)buf[pos + 1] << 16 | (unsigned int)buf[pos + 2] << 8 | buf[pos + 3];
#else
    const unsigned int* w = (const unsigned int*)buf + (pos >> 2);
    const unsigned int x = __funnelshift_r(__ldg(w), __ldg(w + 1), (unsigned int)(pos & 3) * 8);
    return __byte_perm(x, 0, 0x0123);
#endif
}

FLAC_DEV long long fb_pos(const FlacBits& b) { return b.byte * 8 - b.n; }  // bits from buf[0]

FLAC_DEV int fb_over(const FlacBits& b) { return fb_pos(b) > b.limit * 8; }  // read past the frame's bytes

FLAC_DEV void fb_refill(FlacBits& b) {  // at least 32 valid bits after it
    if (b.n <= 32) {
        b.cache |= (u64)b.ahead << (32 - b.n);
        b.byte += 4;
        b.n += 32;
        b.ahead = b.byte < b.limit ? load_be32(b.buf, b.byte) : 0u;
    }
}

FLAC_DEV unsigned int fb_read(FlacBits& b, int k) {  // k in [0, 32]
    if (k == 0) return 0;
    if (b.n < k) fb_refill(b);
    const unsigned int v = (unsigned int)(b.cache >> (64 - k));
    b.cache <<= k;
    b.n -= k;
    return v;
}

FLAC_DEV int fb_signed(FlacBits& b, int k) {  // k in [1, 32]
    unsigned int v = fb_read(b, k);
    if (k < 32 && (v >> (k - 1))) v |= ~0u << k;
    return (int)v;
}

FLAC_DEV unsigned int fb_unary(FlacBits& b) {  // zeros before the next one bit
    unsigned int q = 0;
    while (true) {
        if (b.n == 0) fb_refill(b);
        if (b.cache != 0) {
#ifdef FLAC_HOST
            const int z = __builtin_clzll(b.cache);
#else
            const int z = __clzll((long long)b.cache);
#endif
            q += z;
            b.cache = z + 1 < 64 ? b.cache << (z + 1) : 0;
            b.n -= z + 1;
            return q;
        }
        q += b.n;
        b.n = 0;
        if (fb_over(b) || q > (1u << 30)) return 0xFFFFFFFFu;
    }
}

FLAC_DEV unsigned char flac_crc8(const unsigned char* p, long long n) {
    unsigned int crc = 0;
    for (long long i = 0; i < n; ++i) {
        crc ^= p[i];
        for (int j = 0; j < 8; ++j) crc = (crc & 0x80) ? ((crc << 1) ^ 0x07) & 0xFF : (crc << 1) & 0xFF;
    }
    return (unsigned char)crc;
}

// CRC-16 (poly 0x8005) of buf[from, to), a table lookup a byte (the table: 256 entries, in shared memory on the GPU)
FLAC_DEV unsigned int flac_crc16(const unsigned char* buf, long long from, long long to, const unsigned short* table) {
    unsigned int crc = 0;
    long long i = from;
    for (; i + 4 <= to; i += 4) {
        const unsigned int w = load_be32(buf, i);
        crc = ((crc << 8) ^ table[((crc >> 8) ^ (w >> 24)) & 0xFF]) & 0xFFFF;
        crc = ((crc << 8) ^ table[((crc >> 8) ^ (w >> 16)) & 0xFF]) & 0xFFFF;
        crc = ((crc << 8) ^ table[((crc >> 8) ^ (w >> 8)) & 0xFF]) & 0xFFFF;
        crc = ((crc << 8) ^ table[((crc >> 8) ^ w) & 0xFF]) & 0xFFFF;
    }
    for (; i < to; ++i) crc = ((crc << 8) ^ table[((crc >> 8) ^ buf[i]) & 0xFF]) & 0xFFFF;
    return crc;
}

FLAC_DEV unsigned short crc16_entry(int i) {
    unsigned int c = (unsigned int)i << 8;
    for (int j = 0; j < 8; ++j) c = (c & 0x8000) ? ((c << 1) ^ 0x8005) & 0xFFFF : (c << 1) & 0xFFFF;
    return (unsigned short)c;
}

// Where a channel's samples go as they are decoded: mode 0 float32 into f (an independent channel); mode 1 int32
// into i (the first channel of a stereo pair, kept for the second); mode 2 the second of a pair: with the first's
// int (i) into left and right floats (f0 the first's place, f its own), as the channel assignment says.
struct FlacSink {
    float* f;
    float* f0;
    int* i;
    int mode;
    int assign;
    int wasted;
    float norm;
};

FLAC_DEV void emit(const FlacSink& k, int n, int v) {
    v = (int)((unsigned int)v << k.wasted);
    if (k.mode == 0) {
        k.f[n] = (float)v * k.norm;
    } else if (k.mode == 1) {
        k.i[n] = v;
    } else {
        const int a = k.i[n];
        int l, r;
        if (k.assign == 8) {  // left, side
            l = a; r = a - v;
        } else if (k.assign == 9) {  // side, right
            l = a + v; r = v;
        } else {  // mid, side
            const long long mid = ((long long)a << 1) | (v & 1);
            l = (int)((mid + v) >> 1); r = (int)((mid - v) >> 1);
        }
        k.f0[n] = (float)l * k.norm;
        k.f[n] = (float)r * k.norm;
    }
}

// A residual's coding: its parameters' width (4 or 5 bits) and escape code, and its partition order (2^porder
// partitions of bs >> porder samples, the first holding order fewer); 0, or a status where they cannot be.
FLAC_DEV int fb_residual_head(FlacBits& b, int bs, int order, int& pbits, unsigned int& escape, int& porder) {
    const int method = (int)fb_read(b, 2);
    if (method > 1) return FLAC_E_RESIDUAL;
    pbits = method == 0 ? 4 : 5;
    escape = method == 0 ? 15u : 31u;
    porder = (int)fb_read(b, 4);
    return (bs & ((1 << porder) - 1)) != 0 || (bs >> porder) < order ? FLAC_E_RESIDUAL : 0;
}

// One residual into r: Rice-coded with parameter rk, or raw bits of width raw where its partition is escaped
// (raw >= 0); 0, or a status where it cannot be.
FLAC_DEV int fb_residual(FlacBits& b, unsigned int rk, int raw, int& r) {
    if (raw >= 0) {
        r = raw ? fb_signed(b, raw) : 0;
        return 0;
    }
    const unsigned int q = fb_unary(b);
    if (q == 0xFFFFFFFFu || (rk > 0 && q >= (1u << (32 - rk)))) return FLAC_E_RESIDUAL;
    const unsigned int v = (q << rk) | fb_read(b, (int)rk);
    r = (int)(v >> 1) ^ -(int)(v & 1);
    return 0;
}

// The residual of a predicted subframe decoded and each sample predicted as it comes, its history in registers,
// every kind of prediction as one code path (a warp's threads decode frames whose subframes differ; different
// paths would run in turn): FIXED orders 0-4 as LPC with their binomial coefficients and no shift, LPC up to
// MAXO taps (``order`` of them, the rest zero). The partitions in one loop over the samples, a partition's Rice
// parameter read where it starts, so a warp's threads go through their samples together whatever their
// partitions' sizes.
template <int MAXO, typename ACC>
FLAC_DEV int predicted(FlacBits& b, const FlacSink& k, int bs, int order, const int* warm, const int* coef, int shift) {
    int h[MAXO];
    int c[MAXO];
#pragma unroll
    for (int j = 0; j < MAXO; ++j) {  // h[0] the latest sample
        h[j] = j < order ? warm[order - 1 - j] : 0;
        c[j] = j < order ? coef[j] : 0;
    }
    for (int n = 0; n < order; ++n) emit(k, n, warm[n]);
    int pbits, porder;
    unsigned int escape;
    if (fb_residual_head(b, bs, order, pbits, escape, porder)) return FLAC_E_RESIDUAL;
    const int part = bs >> porder;
    int next = order;  // where the next partition's parameter is read (the first partition holds order fewer)
    int end = part;
    unsigned int rk = 0;
    int raw = -1;
    for (int n = order; n < bs; ++n) {
        if (n == next) {
            if (fb_over(b)) return FLAC_E_OVERRUN;
            rk = fb_read(b, pbits);
            raw = rk == escape ? (int)fb_read(b, 5) : -1;
            next = end;
            end += part;
        }
        int r;
        if (fb_residual(b, rk, raw, r)) return FLAC_E_RESIDUAL;
        ACC sum = 0;
#pragma unroll
        for (int j = 0; j < MAXO; ++j) sum += (ACC)c[j] * h[j];
        const int v = (int)((ACC)r + (sum >> shift));
#pragma unroll
        for (int j = MAXO - 1; j > 0; --j) h[j] = h[j - 1];
        h[0] = v;
        emit(k, n, v);
    }
    return fb_over(b) ? FLAC_E_OVERRUN : 0;
}

// A predicted subframe: every kind through one template, FIXED as LPC with its binomial taps and no shift; its
// sums in 32 bits where they cannot overflow (``narrow``: libFLAC's own test, bps + precision + log2(order) <= 32;
// FIXED's taps sum to at most 15 in magnitude), else in 64; the history as long as the highest order needs.
// (Narrow sums and an 8-tap form took a launch of 64 clips from 2.90 to 2.64 ms on an H100, 2026-12-06.)
template <typename ACC>
FLAC_DEV int predict_as(FlacBits& b, const FlacSink& k, int bs, int order, const int* warm, const int* coef, int shift) {
    if (order <= 8) return predicted<8, ACC>(b, k, bs, order, warm, coef, shift);
    if (order <= 12) return predicted<12, ACC>(b, k, bs, order, warm, coef, shift);
    return predicted<32, ACC>(b, k, bs, order, warm, coef, shift);
}

FLAC_DEV int predict(FlacBits& b, const FlacSink& k, int bs, int order, int lpc, const int* warm, int* coef, int shift,
                     int narrow) {
    if (!lpc) {  // FIXED: x[n] = sum of (-1)^j C(order, j+1) x[n-1-j]
        const int fixed[4][4] = {{1, 0, 0, 0}, {2, -1, 0, 0}, {3, -3, 1, 0}, {4, -6, 4, -1}};
        for (int j = 0; j < order; ++j) coef[j] = fixed[order - 1][j];
    }
    return narrow ? predict_as<int>(b, k, bs, order, warm, coef, shift)
                  : predict_as<long long>(b, k, bs, order, warm, coef, shift);
}

// One subframe of bs samples into its sink (its wasted bits shifted back in); 0 or a status.
FLAC_DEV int flac_subframe(FlacBits& b, FlacSink k, int bs, int bps) {
    if (fb_read(b, 1) != 0) return FLAC_E_SUBFRAME;
    const int type = (int)fb_read(b, 6);
    k.wasted = 0;
    if (fb_read(b, 1)) {
        const unsigned int z = fb_unary(b);
        if (z == 0xFFFFFFFFu || (int)z + 1 >= bps) return FLAC_E_SUBFRAME;
        k.wasted = (int)z + 1;
        bps -= k.wasted;
    }
    if (type == 0) {  // constant
        const int v = fb_signed(b, bps);
        for (int n = 0; n < bs; ++n) emit(k, n, v);
        return fb_over(b) ? FLAC_E_OVERRUN : 0;
    }
    if (type == 1) {  // verbatim
        for (int n = 0; n < bs; ++n) emit(k, n, fb_signed(b, bps));
        return fb_over(b) ? FLAC_E_OVERRUN : 0;
    }
    int order, lpc = 0;
    if (type >= 8 && type <= 12) order = type - 8;
    else if (type >= 32) { order = type - 31; lpc = 1; }
    else return FLAC_E_SUBFRAME;
    if (order > bs) return FLAC_E_SUBFRAME;
    int warm[32], coef[32];
    for (int i = 0; i < order; ++i) warm[i] = fb_signed(b, bps);
    int shift = 0, precision = 0;
    if (lpc) {
        precision = (int)fb_read(b, 4) + 1;
        if (precision == 16) return FLAC_E_SUBFRAME;
        shift = fb_signed(b, 5);
        if (shift < 0) return FLAC_E_SUBFRAME;
        for (int j = 0; j < order; ++j) coef[j] = fb_signed(b, precision);
    }
    int log2_order = 0;  // (floor)
    while ((2 << log2_order) <= order) ++log2_order;
    return predict(b, k, bs, order, lpc, warm, coef, shift, lpc ? bps + precision + log2_order <= 32 : bps + 4 <= 32);
}


// Frame f of the table: its samples into out as float32 (a stereo pair's first channel as int32 until the second
// comes), checked as it goes.
FLAC_DEV int flac_frame(const unsigned char* buf, const long long* row, float* outf, const unsigned short* crc_table) {
    const long long start = row[0], end = row[1], base = row[2], first = row[3], expect = row[4];
    const long long stride = row[5], flags = row[6];
    const int channels = (int)(flags & 0xFF), bps_info = (int)((flags >> 8) & 0xFF), last = (int)((flags >> 16) & 1);
    FlacBits b;
    fb_start(b, buf, start, end);
    if (fb_read(b, 15) != 0x7FFC) return FLAC_E_HEADER;  // 0b111111111111100: sync and the reserved bit
    fb_read(b, 1);  // blocking strategy (the host placed the frame)
    const int bs_code = (int)fb_read(b, 4), sr_code = (int)fb_read(b, 4);
    const int assign = (int)fb_read(b, 4), ss_code = (int)fb_read(b, 3);
    if (fb_read(b, 1) != 0 || bs_code == 0 || sr_code == 15 || assign > 10 || ss_code == 3) return FLAC_E_HEADER;
    // the coded frame or sample number (UTF-8-like, 1 to 7 bytes)
    const unsigned int lead = fb_read(b, 8);
    int more = 0;
    if (lead >= 0x80) {
        if (lead == 0xFF) return FLAC_E_HEADER;
        if (lead >= 0xFE) more = 6; else if (lead >= 0xFC) more = 5; else if (lead >= 0xF8) more = 4;
        else if (lead >= 0xF0) more = 3; else if (lead >= 0xE0) more = 2; else if (lead >= 0xC0) more = 1;
        else return FLAC_E_HEADER;
        for (int i = 0; i < more; ++i) if ((fb_read(b, 8) & 0xC0) != 0x80) return FLAC_E_HEADER;
    }
    int bs;
    if (bs_code == 1) bs = 192;
    else if (bs_code <= 5) bs = 576 << (bs_code - 2);
    else if (bs_code == 6) bs = (int)fb_read(b, 8) + 1;
    else if (bs_code == 7) bs = (int)fb_read(b, 16) + 1;
    else bs = 256 << (bs_code - 8);
    if (sr_code == 12) fb_read(b, 8); else if (sr_code == 13 || sr_code == 14) fb_read(b, 16);
    const long long head_bytes = fb_pos(b) / 8 - start;
    const unsigned int crc8 = fb_read(b, 8);
    if (fb_over(b)) return FLAC_E_HEADER;
    if (flac_crc8(buf + start, head_bytes) != crc8) return FLAC_E_CRC8;
    const int bps = ss_code == 0 ? bps_info : ss_code == 1 ? 8 : ss_code == 2 ? 12 : ss_code == 4 ? 16
                    : ss_code == 5 ? 20 : ss_code == 6 ? 24 : 32;
    const int nch = assign < 8 ? assign + 1 : 2;
    if (bps != bps_info || nch != channels || bps > 24 || bps < 4) return FLAC_E_SHAPE;
    if (bs != expect) return FLAC_E_SHAPE;
    const float norm = 1.0f / (float)(1 << (bps - 1));
    float* at = outf + base + first;
    for (int c = 0; c < nch; ++c) {
        const int side = (assign == 8 && c == 1) || (assign == 9 && c == 0) || (assign == 10 && c == 1);
        FlacSink k;
        k.f = at + c * stride;
        k.f0 = at;
        k.i = (int*)at;
        k.mode = assign < 8 ? 0 : c == 0 ? 1 : 2;
        k.assign = assign;
        k.wasted = 0;
        k.norm = norm;
        const int st = flac_subframe(b, k, bs, bps + side);
        if (st) return st;
    }
    // byte alignment, then the frame's CRC-16
    const long long crc_at = (fb_pos(b) + 7) / 8;
    if (last ? crc_at + 2 > end : crc_at + 2 != end) return FLAC_E_END;
    const unsigned int crc16 = (unsigned int)buf[crc_at] << 8 | buf[crc_at + 1];
    if (flac_crc16(buf, start, crc_at, crc_table) != crc16) return FLAC_E_CRC16;
    return 0;
}

#ifdef KEEP_flac_frames
extern "C" __global__ void flac_frames(const unsigned char* __restrict__ buf, const long long* __restrict__ table,
                                       float* __restrict__ out, int* __restrict__ status, int frames) {
    __shared__ unsigned short crc_table[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) crc_table[i] = crc16_entry(i);
    __syncthreads();
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= frames) return;
    status[f] = flac_frame(buf, table + (long long)f * FLAC_COLS, out, crc_table);
}
#endif

#ifdef FLAC_HOST
extern "C" int flac_frames_host(const unsigned char* buf, const long long* table, float* out, int* status, int frames) {
    unsigned short crc_table[256];
    for (int i = 0; i < 256; ++i) crc_table[i] = crc16_entry(i);
    int bad = 0;
    for (int f = 0; f < frames; ++f) {
        status[f] = flac_frame(buf, table + (long long)f * FLAC_COLS, out, crc_table);
        bad += status[f] != 0;
    }
    return bad;
}
#endif
