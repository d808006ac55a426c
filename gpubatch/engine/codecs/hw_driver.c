/* gpubatch's hardware-decode driver: one native thread that makes the hardware JPEG engine's batched
 * nvJPEG calls which Python queues, outside the interpreter's lock.
 *
 * Why: a Python thread that makes these calls must take the GIL back after each, and waits for it
 * while the process's other threads run Python (a switch interval or more each time). Under `convert`
 * and the training loader that thread got about half the calls' rate it gets alone (docs/engine.md).
 * Here Python queues a call (a few field writes, the GIL kept), goes on with its own work, and later
 * waits for the call's end; the calls themselves run back to back in this thread.
 *
 * No CUDA or nvJPEG headers: the functions come as addresses from the libraries Python has loaded
 * (nvjpegDecodeBatchedInitialize, nvjpegDecodeBatched, nvjpegDecodeBatchedEx, cuCtxSetCurrent,
 * cuEventQuery, cuEventSynchronize, cuEventRecord), each returning a status where 0 is success.
 * Built by gpubatch with the system C compiler on first use (engine/codecs/hw_native.py). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef int (*fn_init)(void *, void *, int, int, int);
typedef int (*fn_batched)(void *, void *, void *, void *, void *, void *);
typedef int (*fn_batched_ex)(void *, void *, void *, void *, void *, void *, void *);
typedef int (*fn_one)(void *);
typedef int (*fn_record)(void *, void *);

enum { F_INIT, F_BATCHED, F_BATCHED_EX, F_CTX_SET, F_EVENT_QUERY, F_EVENT_SYNC, F_EVENT_RECORD, F_COUNT };

/* One call, owned by Python until `done` (its layout is hw_native.Call's). */
typedef struct gb_call {
    void *handle, *state;     /* nvjpegHandle_t, nvjpegJpegState_t */
    int n, fmt;               /* images, nvjpegOutputFormat_t */
    void *data, *sizes;       /* const unsigned char *const *, const size_t * */
    void *images, *params;    /* nvjpegImage_t *, nvjpegDecodeParams_t * (NULL: nvjpegDecodeBatched) */
    void *stream;             /* cudaStream_t */
    void *before;             /* event: the instance's previous call's end, waited for on the host (or NULL) */
    void *after;              /* event recorded after the call on `stream` (or NULL) */
    void *publish;            /* a second event recorded after it (or NULL) */
    int status;               /* 0, or the first failing call's status */
    int step;                 /* 0 ok; where it failed: 1 the wait, 2 initialize, 3 decode, 4 a record, 5 the context */
    int64_t ns;               /* nanoseconds in this call's work */
    int64_t wait_ns;          /* of which in the wait for `before` (the GPU still on the instance's last call) */
    int done;                 /* 1 once finished (under the driver's mutex) */
} gb_call;

typedef struct gb_driver {
    void *fn[F_COUNT];
    void *ctx;
    int ctx_status;
    pthread_mutex_t mu;
    pthread_cond_t more, finished;
    gb_call **ring;
    int cap, head, count, stop;
    pthread_t thread;
} gb_driver;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void make(gb_driver *d, gb_call *c) {
    int64_t t0 = now_ns();
    int s = 0, r = 0;
    c->step = 0;
    c->wait_ns = 0;
    if (d->ctx_status) {
        c->status = d->ctx_status;
        c->step = 5;
        c->ns = 0;
        return;
    }
    if (c->before && ((fn_one)d->fn[F_EVENT_QUERY])(c->before) != 0) {
        s = ((fn_one)d->fn[F_EVENT_SYNC])(c->before); /* the state's buffers are free again */
        if (s) c->step = 1;
        c->wait_ns = now_ns() - t0;
    }
    if (!s) {
        s = ((fn_init)d->fn[F_INIT])(c->handle, c->state, c->n, 1, c->fmt);
        if (s) c->step = 2;
    }
    if (!s) {
        if (c->params)
            s = ((fn_batched_ex)d->fn[F_BATCHED_EX])(c->handle, c->state, c->data, c->sizes, c->images, c->params,
                                                      c->stream);
        else
            s = ((fn_batched)d->fn[F_BATCHED])(c->handle, c->state, c->data, c->sizes, c->images, c->stream);
        if (s) c->step = 3;
    }
    /* the events are recorded whatever happened, as the Python path records its end event in `finally` */
    if (c->after) r = ((fn_record)d->fn[F_EVENT_RECORD])(c->after, c->stream);
    if (!r && c->publish) r = ((fn_record)d->fn[F_EVENT_RECORD])(c->publish, c->stream);
    if (!s && r) {
        s = r;
        c->step = 4;
    }
    c->status = s;
    c->ns = now_ns() - t0;
}

static void *run(void *arg) {
    gb_driver *d = (gb_driver *)arg;
    if (d->ctx) d->ctx_status = ((fn_one)d->fn[F_CTX_SET])(d->ctx);
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->count && !d->stop) pthread_cond_wait(&d->more, &d->mu);
        if (!d->count) { /* stopped, and every queued call made */
            pthread_mutex_unlock(&d->mu);
            return NULL;
        }
        gb_call *c = d->ring[d->head];
        pthread_mutex_unlock(&d->mu);
        make(d, c);
        pthread_mutex_lock(&d->mu);
        d->head = (d->head + 1) % d->cap;
        d->count--;
        c->done = 1;
        pthread_cond_broadcast(&d->finished);
        pthread_mutex_unlock(&d->mu);
    }
}

/* A driver whose thread makes `ctx` (a CUcontext, or NULL) current, then the calls queued; at most `cap`
 * queued at once. NULL where it cannot be made. */
gb_driver *gb_start(void **fn, void *ctx, int cap) {
    gb_driver *d = (gb_driver *)calloc(1, sizeof(gb_driver));
    if (!d || cap < 1) {
        free(d);
        return NULL;
    }
    for (int i = 0; i < F_COUNT; i++) d->fn[i] = fn[i];
    d->ctx = ctx;
    d->cap = cap;
    d->ring = (gb_call **)calloc((size_t)cap, sizeof(gb_call *));
    if (!d->ring) {
        free(d);
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->more, NULL);
    pthread_cond_init(&d->finished, NULL);
    if (pthread_create(&d->thread, NULL, run, d)) {
        pthread_cond_destroy(&d->finished);
        pthread_cond_destroy(&d->more);
        pthread_mutex_destroy(&d->mu);
        free(d->ring);
        free(d);
        return NULL;
    }
    return d;
}

/* Queue `c`: 0, or -1 where the queue is full or the driver stopping (nothing queued). */
int gb_submit(gb_driver *d, gb_call *c) {
    pthread_mutex_lock(&d->mu);
    if (d->stop || d->count == d->cap) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    c->done = 0;
    d->ring[(d->head + d->count) % d->cap] = c;
    d->count++;
    pthread_cond_signal(&d->more);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* Wait until `c` is made, at most `timeout` seconds (< 0: no limit): 1 made, 0 not yet. */
int gb_wait(gb_driver *d, gb_call *c, double timeout) {
    pthread_mutex_lock(&d->mu);
    if (timeout < 0) {
        while (!c->done) pthread_cond_wait(&d->finished, &d->mu);
    } else if (timeout > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t ns = until.tv_nsec + (int64_t)(timeout * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        while (!c->done) {
            if (pthread_cond_timedwait(&d->finished, &d->mu, &until) == ETIMEDOUT) break;
        }
    }
    int done = c->done;
    pthread_mutex_unlock(&d->mu);
    return done;
}

/* Make every queued call, end the thread, free the driver. */
void gb_stop(gb_driver *d) {
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->more);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    pthread_cond_destroy(&d->finished);
    pthread_cond_destroy(&d->more);
    pthread_mutex_destroy(&d->mu);
    free(d->ring);
    free(d);
}
