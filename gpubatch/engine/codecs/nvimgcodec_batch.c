/* Whole-batch-part calls into nvImageCodec's C API for gpubatch (engine/codecs/nvimgcodec_native.py).
 *
 * The thread that hands a batch to the decoders makes, per image, a code stream, reads its header and
 * makes an output image descriptor: three or four library calls of a few microseconds each. Made one
 * by one from Python they hold the GIL the whole time (about 3.6 ms per 256-image batch on the lent
 * H200), while the decoders' own Python threads wait for it each time they come back from a call.
 * Here each is one loop over a whole part, called through ctypes with the GIL released; the decode
 * call and the wait for it are one call too, so a decoder's thread takes the GIL back once per call
 * instead of twice.
 *
 * Compiled at first use with the system C compiler against the nvimgcodec.h the installed wheel
 * ships (a stand-in declares cudaStream_t, the one CUDA type it needs). The library's functions are
 * passed in as pointers (gb_api_t), so this file links against nothing and always calls the copy of
 * nvImageCodec the process already loaded. */

#include <stddef.h> /* nvimgcodec.h needs ptrdiff_t, which the CUDA headers it expects would bring */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nvimgcodec.h"

typedef struct {
    nvimgcodecStatus_t (*cs_from_host)(nvimgcodecInstance_t, nvimgcodecCodeStream_t*, const unsigned char*, size_t,
                                       const nvimgcodecCodeStreamView_t*);
    nvimgcodecStatus_t (*cs_sub)(nvimgcodecCodeStream_t, nvimgcodecCodeStream_t*, const nvimgcodecCodeStreamView_t*);
    nvimgcodecStatus_t (*cs_info)(nvimgcodecCodeStream_t, nvimgcodecImageInfo_t*);
    nvimgcodecStatus_t (*cs_destroy)(nvimgcodecCodeStream_t);
    nvimgcodecStatus_t (*img_create)(nvimgcodecInstance_t, nvimgcodecImage_t*, const nvimgcodecImageInfo_t*);
    nvimgcodecStatus_t (*img_destroy)(nvimgcodecImage_t);
    nvimgcodecStatus_t (*decode)(nvimgcodecDecoder_t, const nvimgcodecCodeStream_t*, const nvimgcodecImage_t*, int,
                                 const nvimgcodecDecodeParams_t*, nvimgcodecFuture_t*);
    nvimgcodecStatus_t (*wait)(nvimgcodecFuture_t);
    nvimgcodecStatus_t (*status)(nvimgcodecFuture_t, nvimgcodecProcessingStatus_t*, size_t*);
    nvimgcodecStatus_t (*future_destroy)(nvimgcodecFuture_t);
} gb_api_t;

/* Size of gb_api_t, so the caller can check it passes what this build expects. */
int gb_api_size(void) { return (int)sizeof(gb_api_t); }

/* Per source i: a code stream over size[i] bytes at host address addr[i], or over its region
 * (y0, x0, y1, x1) = region[4i .. 4i+3] where region is given and region[4i] >= 0; then its first
 * image's size as stored (hw[2i], hw[2i+1]: height, width) and EXIF orientation (turn[3i .. 3i+2]:
 * rotation, flip x, flip y). cs[i] is 0 where the source is not an image (nothing is left to destroy
 * then). Returns how many code streams were made. */
int gb_open_streams(const gb_api_t* api, nvimgcodecInstance_t instance, int n, const uint64_t* addr,
                    const uint64_t* size, const int32_t* region, uint64_t* cs, int32_t* hw, int32_t* turn)
{
    nvimgcodecImageInfo_t info;
    nvimgcodecCodeStreamView_t view;
    int made = 0;
    for (int i = 0; i < n; i++) {
        nvimgcodecCodeStream_t h = NULL; /* a handle already there would be re-initialized, not made anew */
        cs[i] = 0;
        hw[2 * i] = hw[2 * i + 1] = 0;
        turn[3 * i] = turn[3 * i + 1] = turn[3 * i + 2] = 0;
        if (api->cs_from_host(instance, &h, (const unsigned char*)(uintptr_t)addr[i], (size_t)size[i], NULL)
                != NVIMGCODEC_STATUS_SUCCESS || h == NULL)
            continue;
        if (region != NULL && region[4 * i] >= 0) {
            nvimgcodecCodeStream_t sub = NULL;
            memset(&view, 0, sizeof view);
            view.struct_type = NVIMGCODEC_STRUCTURE_TYPE_CODE_STREAM_VIEW;
            view.struct_size = sizeof view;
            view.region.struct_type = NVIMGCODEC_STRUCTURE_TYPE_REGION;
            view.region.struct_size = sizeof view.region;
            view.region.ndim = 2;
            view.region.start[0] = region[4 * i];
            view.region.start[1] = region[4 * i + 1];
            view.region.end[0] = region[4 * i + 2];
            view.region.end[1] = region[4 * i + 3];
            nvimgcodecStatus_t st = api->cs_sub(h, &sub, &view);
            api->cs_destroy(h); /* the sub-stream holds what it needs of it */
            if (st != NVIMGCODEC_STATUS_SUCCESS || sub == NULL)
                continue;
            h = sub;
        }
        memset(&info, 0, sizeof info);
        info.struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO;
        info.struct_size = sizeof info;
        if (api->cs_info(h, &info) != NVIMGCODEC_STATUS_SUCCESS) {
            api->cs_destroy(h);
            continue;
        }
        cs[i] = (uint64_t)(uintptr_t)h;
        hw[2 * i] = (int32_t)info.plane_info[0].height;
        hw[2 * i + 1] = (int32_t)info.plane_info[0].width;
        turn[3 * i] = info.orientation.rotated;
        turn[3 * i + 1] = info.orientation.flip_x;
        turn[3 * i + 2] = info.orientation.flip_y;
        made++;
    }
    return made;
}

/* Per image i: a descriptor of uint8 RGB HWC pixels at device address ptr[i], hw[2i] x hw[2i+1]
 * (the size after the orientation), rows row[i] bytes apart, EXIF orientation turn[3i .. 3i+2] (the
 * decoders apply the one written here), ordered on CUDA stream ``stream``; into img[i]. Returns 0, or
 * i + 1 where image i could not be made (then none is left: those made before it are destroyed). */
int gb_images(const gb_api_t* api, nvimgcodecInstance_t instance, int n, const uint64_t* ptr, const int32_t* hw,
              const uint64_t* row, const int32_t* turn, uint64_t stream, uint64_t* img)
{
    nvimgcodecImageInfo_t info;
    memset(&info, 0, sizeof info);
    info.struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO;
    info.struct_size = sizeof info;
    info.color_spec = NVIMGCODEC_COLORSPEC_SRGB;
    info.sample_format = NVIMGCODEC_SAMPLEFORMAT_I_RGB;
    info.orientation.struct_type = NVIMGCODEC_STRUCTURE_TYPE_ORIENTATION;
    info.orientation.struct_size = sizeof info.orientation;
    info.num_planes = 1;
    info.buffer_kind = NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE;
    info.cuda_stream = (cudaStream_t)(uintptr_t)stream;
    nvimgcodecImagePlaneInfo_t* plane = &info.plane_info[0];
    plane->struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_PLANE_INFO;
    plane->struct_size = sizeof *plane;
    plane->num_channels = 3;
    plane->sample_type = NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8;
    for (int i = 0; i < n; i++) {
        nvimgcodecImage_t h = NULL;
        plane->height = (uint32_t)hw[2 * i];
        plane->width = (uint32_t)hw[2 * i + 1];
        plane->row_stride = (size_t)row[i];
        info.buffer = (void*)(uintptr_t)ptr[i];
        info.orientation.rotated = turn[3 * i];
        info.orientation.flip_x = turn[3 * i + 1];
        info.orientation.flip_y = turn[3 * i + 2];
        if (api->img_create(instance, &h, &info) != NVIMGCODEC_STATUS_SUCCESS || h == NULL) {
            for (int k = 0; k < i; k++) {
                api->img_destroy((nvimgcodecImage_t)(uintptr_t)img[k]);
                img[k] = 0;
            }
            return i + 1;
        }
        img[i] = (uint64_t)(uintptr_t)h;
    }
    return 0;
}

/* One decode call of n code streams into n images, waited for on the host (the GPU work stays
 * ordered on the images' streams, not waited for): ok[i] = 1 where image i decoded. Returns how many
 * decoded, or -1 where the call itself was refused (ok all 0). */
int gb_decode(const gb_api_t* api, nvimgcodecDecoder_t decoder, int n, const uint64_t* cs, const uint64_t* img,
              const nvimgcodecDecodeParams_t* params, uint8_t* ok)
{
    if (n <= 0)
        return 0;
    memset(ok, 0, (size_t)n);
    nvimgcodecFuture_t future = NULL;
    if (api->decode(decoder, (const nvimgcodecCodeStream_t*)cs, (const nvimgcodecImage_t*)img, n, params, &future)
            != NVIMGCODEC_STATUS_SUCCESS || future == NULL)
        return -1;
    api->wait(future);
    nvimgcodecProcessingStatus_t* status = calloc((size_t)n, sizeof *status);
    int good = 0;
    if (status != NULL) {
        size_t got = (size_t)n;
        api->status(future, status, &got);
        for (size_t i = 0; i < got && i < (size_t)n; i++) {
            ok[i] = status[i] == NVIMGCODEC_PROCESSING_STATUS_SUCCESS;
            good += ok[i];
        }
        free(status);
    }
    api->future_destroy(future);
    return good;
}

/* Destroy n_cs code streams and n_img images (zero handles are skipped). */
void gb_destroy(const gb_api_t* api, int n_cs, const uint64_t* cs, int n_img, const uint64_t* img)
{
    for (int i = 0; i < n_cs; i++)
        if (cs[i])
            api->cs_destroy((nvimgcodecCodeStream_t)(uintptr_t)cs[i]);
    for (int i = 0; i < n_img; i++)
        if (img[i])
            api->img_destroy((nvimgcodecImage_t)(uintptr_t)img[i]);
}
