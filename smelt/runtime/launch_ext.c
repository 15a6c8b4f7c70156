/* smelt's kernel launches from C (runtime/fast_launch.py builds it; runtime/cuda_binary.py calls it).
 *
 * launch(function, gx, gy, gz, threads, shared, stream, kinds, args, extra, aligned) writes each
 * argument into the parameter array cuLaunchKernel takes and launches: `kinds` has one letter per
 * argument ('p' a tensor, passed as its data_ptr(); 'i' int32; 'l' int64; 'f' float32) and
 * `extra` more parameters are passed as null pointers (Triton's scratch pointers). It returns the
 * CUresult, or -1 without launching when `aligned` is true and a pointer is not 16-byte aligned
 * (the binary was compiled for aligned pointers). cuLaunchKernel is called through the address
 * set_driver() is given (ctypes finds it in libcuda), so no CUDA header or library is needed here.
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

static PyMethodDef methods[] = {
    {"set_driver", (PyCFunction)set_driver, METH_O, "set_driver(address of cuLaunchKernel)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, threads, shared, stream, kinds, args, extra, aligned) -> CUresult or -1"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "smelt_launch_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_smelt_launch_ext(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (data_ptr_name == NULL)
        return NULL;
    return PyModule_Create(&module);
}
