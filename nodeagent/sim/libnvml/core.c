/*
 * The simulated libnvidia-ml.so.1: the part every entry point shares.
 *
 * Each simulated NVML function (generated from nvml.h by gen.py) widens its arguments to
 * 64-bit integers and calls nvsim_call(), which hands them to the Python simulator
 * (nodeagent.sim.libnvml.bridge.call) under the GIL. Functions the simulator does not model
 * answer NVML_ERROR_NOT_SUPPORTED here without touching Python.
 *
 * Python is reached through dlsym, never linked: loaded into a process that already runs
 * Python (nvidia-ml-py inside nodeagent), the library uses that interpreter and its simulator
 * state; loaded into any other program (NVIDIA's Go tools, a C test) it loads the libpython the
 * library was built for and starts an interpreter on the project's environment, once, then
 * releases the GIL so that every thread of the program can call in. A blocked
 * nvmlEventSetWait_v2 sleeps in Python code that releases the GIL, so it holds up no other call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <wchar.h>

#include "nvsim.h"
#include "nvsim_config.h"

typedef struct py_object PyObject;
typedef int PyGILState_STATE;

static struct {
    int (*IsInitialized)(void);
    void (*InitializeEx)(int);
    void (*SetPythonHome)(const wchar_t *);
    wchar_t *(*DecodeLocale)(const char *, size_t *);
    void *(*SaveThread)(void);
    PyGILState_STATE (*GILEnsure)(void);
    void (*GILRelease)(PyGILState_STATE);
    int (*RunSimpleString)(const char *);
    PyObject *(*ImportModule)(const char *);
    PyObject *(*GetAttrString)(PyObject *, const char *);
    PyObject *(*TupleNew)(ssize_t);
    int (*TupleSetItem)(PyObject *, ssize_t, PyObject *);
    PyObject *(*FromULL)(unsigned long long);
    PyObject *(*FromString)(const char *);
    PyObject *(*CallObject)(PyObject *, PyObject *);
    long (*AsLong)(PyObject *);
    void (*DecRef)(PyObject *);
    void (*ErrPrint)(void);
} py;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static PyObject *bridge_call; /* nodeagent.sim.libnvml.bridge.call, kept for the process */
static int ready;             /* 1 once bridge_call is set */
static int initialized;       /* nvmlInit calls minus nvmlShutdown calls that succeeded */
static int tracing = -1;

static int trace_on(void) {
    if (tracing < 0) {
        const char *value = getenv("NODEAGENT_LIBNVML_TRACE");
        tracing = value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
    }
    return tracing;
}

static void *resolve(void *lib, const char *name, int *missing) {
    void *symbol = dlsym(lib, name);
    if (symbol == NULL) {
        fprintf(stderr, "simulated libnvidia-ml: %s not found in libpython\n", name);
        *missing = 1;
    }
    return symbol;
}

static void start(void) {
    void *lib = RTLD_DEFAULT;
    int missing = 0;
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized") == NULL) {
        lib = dlopen(NVSIM_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
        if (lib == NULL) {
            fprintf(stderr, "simulated libnvidia-ml: cannot load %s (%s); rebuild the library "
                            "with `make libnvml` for this environment\n", NVSIM_LIBPYTHON, dlerror());
            return;
        }
    }
#define R(field, name) *(void **)&py.field = resolve(lib, name, &missing)
    R(IsInitialized, "Py_IsInitialized");
    R(InitializeEx, "Py_InitializeEx");
    R(DecodeLocale, "Py_DecodeLocale");
    R(SaveThread, "PyEval_SaveThread");
    R(GILEnsure, "PyGILState_Ensure");
    R(GILRelease, "PyGILState_Release");
    R(RunSimpleString, "PyRun_SimpleString");
    R(ImportModule, "PyImport_ImportModule");
    R(GetAttrString, "PyObject_GetAttrString");
    R(TupleNew, "PyTuple_New");
    R(TupleSetItem, "PyTuple_SetItem");
    R(FromULL, "PyLong_FromUnsignedLongLong");
    R(FromString, "PyUnicode_FromString");
    R(CallObject, "PyObject_CallObject");
    R(AsLong, "PyLong_AsLong");
    R(DecRef, "Py_DecRef");
    R(ErrPrint, "PyErr_Print");
#undef R
    /* Deprecated since 3.11 but the one call that needs no PyConfig layout. */
    *(void **)&py.SetPythonHome = dlsym(lib, "Py_SetPythonHome");
    if (missing)
        return;

    int own = !py.IsInitialized();
    if (own) {
        if (py.SetPythonHome != NULL) {
            /* Kept for the interpreter's lifetime, as Py_SetPythonHome requires. */
            wchar_t *home = py.DecodeLocale(NVSIM_PYTHONHOME, NULL);
            if (home != NULL)
                py.SetPythonHome(home);
        }
        py.InitializeEx(0); /* 0: leave the host program's signal handlers alone */
    }
    PyGILState_STATE gil = py.GILEnsure();
    /* The project's environment, for a fresh interpreter or a foreign one that lacks it. */
    py.RunSimpleString(NVSIM_SETUP);
    PyObject *module = py.ImportModule("nodeagent.sim.libnvml.bridge");
    if (module == NULL) {
        py.ErrPrint();
    } else {
        bridge_call = py.GetAttrString(module, "call");
        if (bridge_call == NULL)
            py.ErrPrint();
        py.DecRef(module);
    }
    py.GILRelease(gil);
    if (own)
        py.SaveThread(); /* the thread that started Python gives the GIL back */
    ready = bridge_call != NULL;
}

static int is_init(const char *name) {
    return strcmp(name, "nvmlInit_v2") == 0 || strcmp(name, "nvmlInit") == 0 ||
           strcmp(name, "nvmlInitWithFlags") == 0;
}

int nvsim_call(const char *name, int argc, const uint64_t *argv) {
    pthread_once(&once, start);
    if (!ready)
        return is_init(name) ? 9 /* DRIVER_NOT_LOADED */ : 1 /* UNINITIALIZED */;
    int rc = 999;
    PyGILState_STATE gil = py.GILEnsure();
    PyObject *args = py.TupleNew(argc + 1);
    if (args != NULL) {
        py.TupleSetItem(args, 0, py.FromString(name));
        for (int i = 0; i < argc; i++)
            py.TupleSetItem(args, i + 1, py.FromULL(argv[i]));
        PyObject *result = py.CallObject(bridge_call, args);
        if (result == NULL) {
            py.ErrPrint();
        } else {
            rc = (int)py.AsLong(result);
            py.DecRef(result);
        }
        py.DecRef(args);
    }
    py.GILRelease(gil);
    if (rc == 0) {
        if (is_init(name))
            __atomic_add_fetch(&initialized, 1, __ATOMIC_SEQ_CST);
        else if (strcmp(name, "nvmlShutdown") == 0)
            __atomic_sub_fetch(&initialized, 1, __ATOMIC_SEQ_CST);
    }
    if (rc != 0 && trace_on())
        fprintf(stderr, "simulated libnvidia-ml: %s -> %d\n", name, rc);
    return rc;
}

int nvsim_unsupported(const char *name) {
    if (trace_on())
        fprintf(stderr, "simulated libnvidia-ml: %s is not simulated -> NOT_SUPPORTED\n", name);
    /* As the driver: nothing works before nvmlInit. */
    return __atomic_load_n(&initialized, __ATOMIC_SEQ_CST) > 0 ? 3 : 1;
}
