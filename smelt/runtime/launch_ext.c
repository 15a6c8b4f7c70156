/* smelt's kernel launches from C (runtime/fast_launch.py builds it).
 *
 * launch(function, gx, gy, gz, threads, shared, stream, kinds, args, extra, aligned), for CUDA kernels
 * (runtime/cuda_binary.py), writes each argument into the parameter array cuLaunchKernel takes and launches:
 * `kinds` has one letter per argument ('p' a tensor, passed as its data_ptr(); 'i' int32; 'l' int64; 'f'
 * float32; 'd' float64) and `extra` more parameters are passed as null pointers (Triton's scratch pointers). It returns the
 * CUresult, or -1 without launching when `aligned` is true and a pointer is not 16-byte aligned (the binary
 * was compiled for aligned pointers). cuLaunchKernel is called through the address set_driver() is given
 * (ctypes finds it in libcuda), so no CUDA header or library is needed here.
 *
 * halide_run(function, argv, buffers, sizes, num_buffers, num_inputs, codes, args), for Halide's CPU kernels
 * (runtime/halide_launcher.py), checks each CPU tensor of `args` against the type the launcher set in the
 * halide_buffer_t at `buffers` and describes it there (as HalideLauncher._describe does), and the int32
 * sizes that follow them, in copies of its own of the launcher's descriptions, and calls the pipeline's
 * argv entry point on those with the GIL released (other threads may launch the same kernel meanwhile).
 * It returns the pipeline's status.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_kernel_t)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, void *stream, void **params, void **extra);

#define MAX_PARAMS 512

static launch_kernel_t launch_kernel = NULL;
static PyObject *data_ptr_name = NULL;

static PyObject *set_driver(PyObject *self, PyObject *address) {
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    launch_kernel = (launch_kernel_t)p;
    Py_RETURN_NONE;
}

static int write_argument(char kind, PyObject *value, uint64_t *slot, int aligned, int *misaligned) {
    switch (kind) {
    case 'p': {
        PyObject *address = PyObject_CallMethodNoArgs(value, data_ptr_name);
        if (address == NULL)
            return -1;
        unsigned long long pointer = PyLong_AsUnsignedLongLong(address);
        Py_DECREF(address);
        if (pointer == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (aligned && (pointer & 15))
            *misaligned = 1;
        *slot = (uint64_t)pointer;
        return 0;
    }
    case 'i': {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < INT32_MIN || v > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "smelt launch: %lld does not fit the kernel's int32 argument", v);
            return -1;
        }
        int32_t narrow = (int32_t)v;
        memcpy(slot, &narrow, sizeof narrow);
        return 0;
    }
    case 'l': {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred())
            return -1;
        int64_t wide = (int64_t)v;
        memcpy(slot, &wide, sizeof wide);
        return 0;
    }
    case 'f': {
        double v = PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
        float narrow = (float)v;
        memcpy(slot, &narrow, sizeof narrow);
        return 0;
    }
    case 'd': {
        double v = PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
        memcpy(slot, &v, sizeof v);
        return 0;
    }
    default:
        PyErr_Format(PyExc_ValueError, "smelt launch: unknown argument kind '%c'", kind);
        return -1;
    }
}

static PyObject *launch(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (n != 11) {
        PyErr_SetString(PyExc_TypeError, "smelt launch: takes 11 arguments");
        return NULL;
    }
    if (launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "smelt launch: set_driver was not called");
        return NULL;
    }
    void *function = PyLong_AsVoidPtr(a[0]);
    unsigned long grid[3], threads, shared;
    for (int d = 0; d < 3; d++)
        grid[d] = PyLong_AsUnsignedLong(a[1 + d]);
    threads = PyLong_AsUnsignedLong(a[4]);
    shared = PyLong_AsUnsignedLong(a[5]);
    void *stream = PyLong_AsVoidPtr(a[6]);
    Py_ssize_t extra = PyLong_AsSsize_t(a[9]);
    int aligned = PyObject_IsTrue(a[10]);
    if (PyErr_Occurred())
        return NULL;
    char *kinds;
    Py_ssize_t count;
    if (PyBytes_AsStringAndSize(a[7], &kinds, &count) < 0)
        return NULL;
    if (!PyTuple_Check(a[8]) || PyTuple_GET_SIZE(a[8]) != count || extra < 0 || count + extra > MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "smelt launch: arguments do not match their kinds");
        return NULL;
    }
    uint64_t slots[MAX_PARAMS];
    void *params[MAX_PARAMS];
    int misaligned = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        slots[i] = 0;
        if (write_argument(kinds[i], PyTuple_GET_ITEM(a[8], i), &slots[i], aligned, &misaligned) < 0)
            return NULL;
        params[i] = &slots[i];
    }
    if (misaligned)
        return PyLong_FromLong(-1);
    for (Py_ssize_t i = count; i < count + extra; i++) {
        slots[i] = 0;
        params[i] = &slots[i];
    }
    int status = launch_kernel(function, (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2], (unsigned)threads,
                               1, 1, (unsigned)shared, stream, params, NULL);
    return PyLong_FromLong(status);
}

/* The halide_buffer_t of Halide's runtime header (HalideBuffer in halide_launcher.py: same layout). */
typedef struct {
    int32_t min, extent, stride;
    uint32_t flags;
} halide_dim;
typedef struct {
    uint8_t code, bits;
    uint16_t lanes;
} halide_type;
typedef struct {
    uint64_t device;
    void *device_interface;
    uint8_t *host;
    uint64_t flags;
    halide_type type;
    int32_t dimensions;
    halide_dim *dim;
    void *padding;
} halide_buffer;

typedef int (*halide_argv_t)(void **argv);

/* The address given for an empty tensor (see halide_launcher._EMPTY). */
static uint64_t empty_placeholder = 0;
static PyObject *is_cpu_name, *dtype_name, *numel_name, *storage_offset_name, *element_size_name,
    *untyped_storage_name, *nbytes_name;

static int call_int(PyObject *object, PyObject *name, long long *out) {
    PyObject *value = PyObject_CallMethodNoArgs(object, name);
    if (value == NULL)
        return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int describe(halide_buffer *buffer, Py_ssize_t k, Py_ssize_t num_inputs, PyObject *codes, PyObject *t) {
    PyObject *is_cpu = PyObject_GetAttr(t, is_cpu_name);
    if (is_cpu == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "got %s for buffer %zd: it runs on CPU tensors", Py_TYPE(t)->tp_name, k);
        return -1;
    }
    int cpu = is_cpu == Py_True;
    Py_DECREF(is_cpu);
    if (!cpu) {
        PyErr_Format(PyExc_TypeError, "got a tensor of another device for buffer %zd: it runs on CPU tensors", k);
        return -1;
    }
    PyObject *dtype = PyObject_GetAttr(t, dtype_name);
    if (dtype == NULL)
        return -1;
    PyObject *code = PyDict_GetItemWithError(codes, dtype);  /* borrowed */
    Py_DECREF(dtype);
    if (code == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "buffer %zd has a dtype Halide's kernels do not take", k);
        return -1;
    }
    long packed = PyLong_AsLong(code);
    /* The launcher set each buffer's type from the kernel's dtypes; the pipeline, built without
     * asserts, would not check it (halide_compile.kernel_target). */
    if (packed != (long)(buffer->type.code | buffer->type.bits << 8)) {
        PyErr_Format(PyExc_TypeError, "buffer %zd is of another dtype than the kernel reads", k);
        return -1;
    }
    long long numel, offset, itemsize, nbytes;
    if (call_int(t, numel_name, &numel) < 0 || call_int(t, storage_offset_name, &offset) < 0 ||
        call_int(t, element_size_name, &itemsize) < 0)
        return -1;
    PyObject *storage = PyObject_CallMethodNoArgs(t, untyped_storage_name);
    if (storage == NULL)
        return -1;
    int failed = call_int(storage, nbytes_name, &nbytes);
    Py_DECREF(storage);
    if (failed)
        return -1;
    long long extent = nbytes / itemsize - offset;
    if (extent > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "a buffer of %lld elements is past Halide's int32 extents", extent);
        return -1;
    }
    if (numel == 0 || extent <= 0) {
        buffer->host = (uint8_t *)&empty_placeholder;
        buffer->dim->extent = k < num_inputs ? 1 : 0;
        return 0;
    }
    long long address;
    if (call_int(t, data_ptr_name, &address) < 0)
        return -1;
    buffer->host = (uint8_t *)(uintptr_t)address;
    buffer->dim->extent = (int32_t)extent;
    return 0;
}

/* Buffers and sizes a Halide pipeline takes at most (its launcher's descriptions are copied to the stack). */
#define MAX_HALIDE_BUFFERS 256
#define MAX_HALIDE_SIZES 64

static PyObject *halide_run(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (n != 8 || !PyDict_Check(a[6]) || !PyTuple_Check(a[7])) {
        PyErr_SetString(PyExc_TypeError, "halide_run(function, argv, buffers, sizes, num_buffers, num_inputs, codes, args)");
        return NULL;
    }
    halide_argv_t function = (halide_argv_t)PyLong_AsVoidPtr(a[0]);
    void **argv = (void **)PyLong_AsVoidPtr(a[1]);
    halide_buffer *buffers = (halide_buffer *)PyLong_AsVoidPtr(a[2]);
    int32_t *sizes = (int32_t *)PyLong_AsVoidPtr(a[3]);
    Py_ssize_t num_buffers = PyLong_AsSsize_t(a[4]), num_inputs = PyLong_AsSsize_t(a[5]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *args = a[7];
    Py_ssize_t num_sizes = PyTuple_GET_SIZE(args) - num_buffers;
    if (num_sizes < 0) {
        PyErr_SetString(PyExc_TypeError, "fewer arguments than buffers");
        return NULL;
    }
    if (num_buffers > MAX_HALIDE_BUFFERS || num_sizes > MAX_HALIDE_SIZES) {
        PyErr_Format(PyExc_TypeError, "%zd buffers and %zd sizes: more than the C launch takes", num_buffers, num_sizes);
        return NULL;
    }
    /* This call's own descriptions, copied from the launcher's: with the GIL released below, another
     * thread may be running the same kernel on other tensors, and must not see these. */
    halide_buffer local[MAX_HALIDE_BUFFERS];
    halide_dim dims[MAX_HALIDE_BUFFERS];
    int32_t local_sizes[MAX_HALIDE_SIZES];
    void *local_argv[MAX_HALIDE_BUFFERS + MAX_HALIDE_SIZES];
    for (Py_ssize_t k = 0; k < num_buffers; k++) {
        local[k] = buffers[k];
        dims[k] = *buffers[k].dim;
        local[k].dim = &dims[k];
        if (describe(&local[k], k, num_inputs, a[6], PyTuple_GET_ITEM(args, k)) < 0)
            return NULL;
    }
    for (Py_ssize_t k = 0; k < num_sizes; k++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(args, num_buffers + k));
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v < -INT32_MAX || v > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "size %zd = %lld does not fit Halide's int32 index math", k, v);
            return NULL;
        }
        local_sizes[k] = (int32_t)v;
    }
    /* The launcher's argv points into its own buffers and sizes (inputs, sizes, outputs): the same
     * order, pointing into this call's. */
    for (Py_ssize_t i = 0; i < num_buffers + num_sizes; i++) {
        char *p = (char *)argv[i];
        if (p >= (char *)buffers && p < (char *)(buffers + num_buffers))
            local_argv[i] = &local[((halide_buffer *)p) - buffers];
        else if (p >= (char *)sizes && p < (char *)(sizes + num_sizes))
            local_argv[i] = &local_sizes[((int32_t *)p) - sizes];
        else
            local_argv[i] = argv[i];
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = function(local_argv);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"set_driver", (PyCFunction)set_driver, METH_O, "set_driver(address of cuLaunchKernel)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, threads, shared, stream, kinds, args, extra, aligned) -> CUresult or -1"},
    {"halide_run", (PyCFunction)(void (*)(void))halide_run, METH_FASTCALL,
     "halide_run(function, argv, buffers, sizes, num_buffers, num_inputs, codes, args) -> the pipeline's status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "smelt_launch_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_smelt_launch_ext(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    is_cpu_name = PyUnicode_InternFromString("is_cpu");
    dtype_name = PyUnicode_InternFromString("dtype");
    numel_name = PyUnicode_InternFromString("numel");
    storage_offset_name = PyUnicode_InternFromString("storage_offset");
    element_size_name = PyUnicode_InternFromString("element_size");
    untyped_storage_name = PyUnicode_InternFromString("untyped_storage");
    nbytes_name = PyUnicode_InternFromString("nbytes");
    if (!data_ptr_name || !is_cpu_name || !dtype_name || !numel_name || !storage_offset_name || !element_size_name ||
        !untyped_storage_name || !nbytes_name)
        return NULL;
    return PyModule_Create(&module);
}
