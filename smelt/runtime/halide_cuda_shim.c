/* Compiled into smelt's shared Halide CUDA runtime: Halide's CUDA kernels run in PyTorch's CUDA
 * context and on the stream PyTorch has current, never in a context of Halide's own.
 *
 * Each pipeline is compiled with Halide's user_context argument; smelt passes a pointer to a
 * struct smelt_cuda_launch, filled per launch from torch. These definitions replace the weak
 * ones in Halide's runtime (HalideRuntimeCuda.h names them as the ones to override).
 * No CUDA header is needed: Halide's typedefs treat CUcontext and CUstream as void *. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>

struct smelt_cuda_launch {
    void *context;  /* torch's (primary) context of the tensors' device */
    void *stream;   /* torch.cuda.current_stream().cuda_stream */
    int device;
};

/* A launch without smelt's struct (Halide releasing its cached allocations, say) gets the
 * context current on the calling thread. */
static int current_context(void **ctx) {
    typedef int (*get_current_t)(void **);
    static get_current_t get_current;
    if (get_current == NULL) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        get_current = lib ? (get_current_t)dlsym(lib, "cuCtxGetCurrent") : NULL;
    }
    if (get_current == NULL || get_current(ctx) != 0 || *ctx == NULL) {
        return -1;
    }
    return 0;
}

int halide_cuda_acquire_context(void *user_context, void **ctx, bool create) {
    const struct smelt_cuda_launch *launch = user_context;
    (void)create;
    if (launch != NULL && launch->context != NULL) {
        *ctx = launch->context;
        return 0;
    }
    return current_context(ctx);
}

int halide_cuda_release_context(void *user_context) {
    (void)user_context;
    return 0;
}

int halide_cuda_get_stream(void *user_context, void *ctx, void **stream) {
    const struct smelt_cuda_launch *launch = user_context;
    (void)ctx;
    *stream = launch != NULL ? launch->stream : NULL;
    return 0;
}

int halide_get_gpu_device(void *user_context) {
    const struct smelt_cuda_launch *launch = user_context;
    return launch != NULL ? launch->device : 0;
}

/* Halide looks for libcuda.so, which a driver-only install may lack; libcuda.so.1 is always
 * there where torch runs CUDA. */
void *halide_cuda_get_symbol(void *user_context, const char *name) {
    static void *lib;
    (void)user_context;
    if (lib == NULL) {
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    }
    return lib ? dlsym(lib, name) : NULL;
}
