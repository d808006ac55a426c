// FLAC frames decoded on the GPU: one thread a frame (a frame's subframes are one bit stream, read in
// order; frames are independent), its samples written as float32 exactly as libsndfile gives them
// (x * 2^-(bps-1): exact for bps <= 24). The host (codecs/flac_gpu.py) finds each frame's start from
// the stream's headers; the thread checks everything it reads (the header's CRC-8, the frame's CRC-16,
// that the frame ends where the next begins, its block size, channels and depth) and writes a status:
// a record with any frame not 0 is decoded again on the CPU, as the CPU path would.
//
// The decode itself is also compiled as C++ on the host (FLAC_HOST defined), where the tests run it
// frame by frame against libsndfile.
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
    const unsigned char* buf;
    long long byte;  // next byte to load
    long long limit; // bytes past this read as zero (a frame that reads past it is refused: fb_over)
    u64 cache;       // MSB-aligned
    int n;           // valid bits in cache
};

FLAC_DEV long long fb_pos(const FlacBits& b) { return b.byte * 8 - b.n; }  // bits from buf[0]

FLAC_DEV int fb_over(const FlacBits& b) { return fb_pos(b) > b.limit * 8; }  // read past the frame's bytes

FLAC_DEV void fb_refill(FlacBits& b) {
    while (b.n <= 56) {
        u64 v = 0;
        if (b.byte < b.limit) v = b.buf[b.byte];
        b.byte++;
        b.cache |= v << (56 - b.n);
        b.n += 8;
    }
}

FLAC_DEV unsigned int fb_read(FlacBits& b, int k) {  // k in [0, 32]
    if (k == 0) return 0;
    if (b.n < k) fb_refill(b);
    unsigned int v = (unsigned int)(b.cache >> (64 - k));
    b.cache <<= k;
    b.n -= k;
    return v;
}

FLAC_DEV int fb_signed(FlacBits& b, int k) {  // k in [1, 32]
    unsigned int v = fb_read(b, k);
    if (k < 32 && (v >> (k - 1))) v |= ~0u << k;
    return (int)v;
}

FLAC_DEV unsigned int fb_unary(FlacBits& b) {  // zeros before the next one bit (the cache's bits past n are 0)
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

FLAC_DEV unsigned int flac_crc16(const unsigned char* p, long long n) {
    unsigned int crc = 0;
    long long i = 0;
    for (; i < n; ++i) {
        crc ^= (unsigned int)p[i] << 8;
        for (int j = 0; j < 8; ++j) crc = (crc & 0x8000) ? ((crc << 1) ^ 0x8005) & 0xFFFF : (crc << 1) & 0xFFFF;
    }
    return crc;
}

// One subframe into out[0, bs) as int32 (its wasted bits shifted back in); 0 or a status.
FLAC_DEV int flac_subframe(FlacBits& b, int* out, int bs, int bps) {
    if (fb_read(b, 1) != 0) return FLAC_E_SUBFRAME;
    const int type = (int)fb_read(b, 6);
    int wasted = 0;
    if (fb_read(b, 1)) {
        unsigned int z = fb_unary(b);
        if (z == 0xFFFFFFFFu) return FLAC_E_SUBFRAME;
        wasted = (int)z + 1;
        if (wasted >= bps) return FLAC_E_SUBFRAME;
        bps -= wasted;
    }
    int order = 0, lpc = 0, precision = 0, shift = 0;
    int coef[32];
    if (type == 0) {  // constant
        const int v = fb_signed(b, bps);
        for (int i = 0; i < bs; ++i) out[i] = v;
    } else if (type == 1) {  // verbatim
        for (int i = 0; i < bs; ++i) out[i] = fb_signed(b, bps);
    } else if (type >= 8 && type <= 12) {  // fixed
        order = type - 8;
    } else if (type >= 32) {  // LPC
        order = type - 31;
        lpc = 1;
    } else {
        return FLAC_E_SUBFRAME;
    }
    if (type >= 8) {
        if (order > bs) return FLAC_E_SUBFRAME;
        for (int i = 0; i < order; ++i) out[i] = fb_signed(b, bps);
        if (lpc) {
            precision = (int)fb_read(b, 4) + 1;
            if (precision == 16) return FLAC_E_SUBFRAME;
            shift = fb_signed(b, 5);
            if (shift < 0) return FLAC_E_SUBFRAME;
            for (int j = 0; j < order; ++j) coef[j] = fb_signed(b, precision);
        }
        // residual
        const int method = (int)fb_read(b, 2);
        if (method > 1) return FLAC_E_RESIDUAL;
        const int pbits = method == 0 ? 4 : 5;
        const unsigned int escape = method == 0 ? 15u : 31u;
        const int porder = (int)fb_read(b, 4);
        const int parts = 1 << porder;
        if ((bs & (parts - 1)) != 0 || (bs >> porder) < order) return FLAC_E_RESIDUAL;
        int i = order;
        for (int p = 0; p < parts; ++p) {
            const int count = (bs >> porder) - (p == 0 ? order : 0);
            const unsigned int k = fb_read(b, pbits);
            if (k == escape) {
                const int nb = (int)fb_read(b, 5);
                for (int c = 0; c < count; ++c, ++i) out[i] = nb ? fb_signed(b, nb) : 0;
            } else {
                for (int c = 0; c < count; ++c, ++i) {
                    const unsigned int q = fb_unary(b);
                    if (q == 0xFFFFFFFFu || (k < 32 && q >= (1u << (32 - k)))) return FLAC_E_RESIDUAL;
                    const unsigned int v = (q << k) | fb_read(b, (int)k);
                    out[i] = (int)(v >> 1) ^ -(int)(v & 1);
                }
            }
            if (fb_over(b)) return FLAC_E_OVERRUN;
        }
        // prediction
        if (lpc) {
            for (int n = order; n < bs; ++n) {
                long long sum = 0;
                for (int j = 0; j < order; ++j) sum += (long long)coef[j] * out[n - 1 - j];
                out[n] = (int)((long long)out[n] + (sum >> shift));
            }
        } else if (order == 1) {
            for (int n = 1; n < bs; ++n) out[n] = (int)((long long)out[n] + out[n - 1]);
        } else if (order == 2) {
            for (int n = 2; n < bs; ++n) out[n] = (int)((long long)out[n] + 2LL * out[n - 1] - out[n - 2]);
        } else if (order == 3) {
            for (int n = 3; n < bs; ++n)
                out[n] = (int)((long long)out[n] + 3LL * out[n - 1] - 3LL * out[n - 2] + out[n - 3]);
        } else if (order == 4) {
            for (int n = 4; n < bs; ++n)
                out[n] = (int)((long long)out[n] + 4LL * out[n - 1] - 6LL * out[n - 2] + 4LL * out[n - 3] - out[n - 4]);
        }
    }
    if (fb_over(b)) return FLAC_E_OVERRUN;
    if (wasted)
        for (int i = 0; i < bs; ++i) out[i] = (int)((unsigned int)out[i] << wasted);
    return 0;
}

// Frame f of the table: its samples into out (float32 bits written as int32 first, then converted).
FLAC_DEV int flac_frame(const unsigned char* buf, const long long* row, float* outf) {
    const long long start = row[0], end = row[1], base = row[2], first = row[3], expect = row[4];
    const long long stride = row[5], flags = row[6];
    const int channels = (int)(flags & 0xFF), bps_info = (int)((flags >> 8) & 0xFF), last = (int)((flags >> 16) & 1);
    FlacBits b;
    b.buf = buf; b.byte = start; b.limit = end; b.cache = 0; b.n = 0;
    if (fb_read(b, 15) != 0x7FFC) return FLAC_E_HEADER;  // 0b111111111111100: sync and the reserved bit
    fb_read(b, 1);  // blocking strategy (the host placed the frame)
    const int bs_code = (int)fb_read(b, 4), sr_code = (int)fb_read(b, 4);
    const int assign = (int)fb_read(b, 4), ss_code = (int)fb_read(b, 3);
    if (fb_read(b, 1) != 0 || bs_code == 0 || sr_code == 15 || assign > 10 || ss_code == 3) return FLAC_E_HEADER;
    // the coded frame or sample number (UTF-8-like, 1 to 7 bytes)
    unsigned int lead = fb_read(b, 8);
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
    int* out = (int*)outf;
    for (int c = 0; c < nch; ++c) {
        const int side = (assign == 8 && c == 1) || (assign == 9 && c == 0) || (assign == 10 && c == 1);
        const int st = flac_subframe(b, out + base + first + c * stride, bs, bps + side);
        if (st) return st;
    }
    // byte alignment, then the frame's CRC-16
    const long long pos = fb_pos(b);
    const long long crc_at = (pos + 7) / 8;
    b = FlacBits{buf, crc_at, end, 0, 0};
    const unsigned int crc16 = fb_read(b, 16);
    if (fb_over(b)) return FLAC_E_END;
    if (last ? crc_at + 2 > end : crc_at + 2 != end) return FLAC_E_END;
    if (flac_crc16(buf + start, crc_at - start) != crc16) return FLAC_E_CRC16;
    // the channels' decorrelation, then float32 as libsndfile gives it
    const int n = (int)expect;
    int* a = out + base + first;
    int* s = out + base + first + stride;
    if (assign == 8) {
        for (int i = 0; i < n; ++i) s[i] = a[i] - s[i];
    } else if (assign == 9) {
        for (int i = 0; i < n; ++i) a[i] = a[i] + s[i];
    } else if (assign == 10) {
        for (int i = 0; i < n; ++i) {
            long long mid = ((long long)a[i] << 1) | (s[i] & 1);
            const long long sd = s[i];
            a[i] = (int)((mid + sd) >> 1);
            s[i] = (int)((mid - sd) >> 1);
        }
    }
    const float norm = 1.0f / (float)(1 << (bps - 1));
    for (int c = 0; c < nch; ++c) {
        int* x = out + base + first + c * stride;
        float* y = outf + base + first + c * stride;
        for (int i = 0; i < n; ++i) y[i] = (float)x[i] * norm;
    }
    return 0;
}

#ifdef KEEP_flac_frames
extern "C" __global__ void flac_frames(const unsigned char* __restrict__ buf, const long long* __restrict__ table,
                                       float* __restrict__ out, int* __restrict__ status, int frames) {
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= frames) return;
    status[f] = flac_frame(buf, table + (long long)f * FLAC_COLS, out);
}
#endif

#ifdef FLAC_HOST
extern "C" int flac_frames_host(const unsigned char* buf, const long long* table, float* out, int* status, int frames) {
    int bad = 0;
    for (int f = 0; f < frames; ++f) {
        status[f] = flac_frame(buf, table + (long long)f * FLAC_COLS, out);
        bad += status[f] != 0;
    }
    return bad;
}
#endif
