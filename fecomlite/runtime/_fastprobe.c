/* The probe's hot path in C: time a call and append it to a column buffer.
 *
 * Why C: a Python wrapper costs ~400 ns a call on a 2-core machine (argument packing, two
 * time.monotonic_ns() calls, a tuple, thread id), and serialising the events again costs as much.
 * Here the call is forwarded with vectorcall (no packing), the clock is clock_gettime
 * (CLOCK_MONOTONIC, the clock time.monotonic_ns reads), and events land in C arrays that drain()
 * hands over as bytes, ready to send. fecomlite/runtime/probe.py falls back to pure Python without it.
 * All state is touched with the GIL held, so appends and drains never interleave.
 * To compilers the module is invisible: compilers.py registers `call` and `dcall` with dynamo as
 * the plain fn(*args, **kwargs).
 *
 * No Python frame of the probe stands between the user's frame and the callee on any path: the
 * sized path calls the Python helpers `before(...)` and `after(...)` around a direct call of fn
 * (caller-frame APIs such as `torch.fx.wrap`, TorchScript's scope lookup, `warnings` attribution
 * and `inspect.stack()` see the user's frame).
 *
 * dcall(site, fn, ...): a call whose callee the instrumenter could not name. The callee is looked
 * at once per site (and again when what it is changes: `callee_key`); a framework callee takes
 * `call`, anything else is called straight through (a dict lookup and a compare).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyObject **site;
    int64_t *t0, *t1, *in_bytes, *out_bytes;
    uint64_t *tid;
    uint8_t *status;
    Py_ssize_t len, cap;
} Buffer;

static Buffer buf;
/* Events recorded so far, in a file-backed shared mapping that outlives the process
 * (`set_counter`): one memory write a record, no syscall, so a run can count the events of a
 * process that died before sending them. NULL: not counted. */
static volatile uint64_t *recorded = NULL;
static Py_buffer recorded_view; /* holds the mapping while `recorded` points into it */
static PyObject *fast_sites = NULL;  /* set of sites on the timestamps-only path */
/* python: before(site, fn, args, kwargs) -> (args, kwargs, state), or None: call it plainly */
static PyObject *before_call = NULL;
/* python: after(site, fn, args, kwargs, result, raised, t0, t1, state); never raises */
static PyObject *after_call = NULL;
static PyObject *sync_call = NULL;   /* python: wait for the GPU (FECOMLITE_SYNC), or NULL */
static PyObject *decide_call = NULL; /* python: decide(fn) -> True for a framework callee */
static PyObject *decisions = NULL;   /* dcall sites: site -> (callee key, True | False) */

/* The calls in progress, per thread, for the live view (`open_calls`): a fixed table of thread
 * slots, each a short stack of (site, start). A call pushes before it runs and pops when it
 * returns, with the GIL held; the flusher reads the table between calls. A thread holds a slot
 * only while its stack is not empty, so threads that come and go never hold memory. Calls past
 * OPEN_DEPTH on one thread, or on more than OPEN_SLOTS threads at once, are not shown (the first
 * only counted in depth). */
#define OPEN_SLOTS 64
#define OPEN_DEPTH 8
typedef struct {
    uint64_t tid;  /* 0: free */
    Py_ssize_t depth;
    PyObject *site[OPEN_DEPTH]; /* a reference held while the call runs */
    int64_t t0[OPEN_DEPTH];
} OpenSlot;

static OpenSlot open_slots[OPEN_SLOTS];
static uint64_t open_generation = 1; /* forget_open() starts a new one: cached slots are stale */
/* Each thread caches the slot it holds while it is in a call (initial-exec: one load). */
static __thread OpenSlot *my_slot __attribute__((tls_model("initial-exec")));
static __thread uint64_t my_generation __attribute__((tls_model("initial-exec")));

static inline OpenSlot *held_slot(void) {
    return my_generation == open_generation ? my_slot : NULL;
}

static inline void open_push(uint64_t tid, PyObject *site, int64_t t0) {
    OpenSlot *s = held_slot();
    if (!s) {
        size_t h = (size_t)((tid * 0x9E3779B97F4A7C15ULL) >> 58); /* 6 bits: OPEN_SLOTS */
        for (size_t k = 0; k < OPEN_SLOTS && !s; k++) {
            OpenSlot *c = &open_slots[(h + k) & (OPEN_SLOTS - 1)];
            if (c->tid == 0) s = c;
        }
        if (!s) return; /* every slot taken: this call is not shown */
        s->tid = tid;
        s->depth = 0;
        my_slot = s;
        my_generation = open_generation;
    }
    if (s->depth < OPEN_DEPTH) {
        Py_INCREF(site);
        s->site[s->depth] = site;
        s->t0[s->depth] = t0;
    }
    s->depth++;
}

/* Pops this call; a call that ends out of order (a greenlet switched stacks) is taken out from
 * where it is. */
static inline void open_pop(PyObject *site, int64_t t0) {
    OpenSlot *s = held_slot();
    if (!s || s->depth <= 0) return;
    Py_ssize_t top = s->depth - 1;
    if (top < OPEN_DEPTH && (s->t0[top] != t0 || s->site[top] != site)) {
        Py_ssize_t i = top;
        while (i >= 0 && !(s->t0[i] == t0 && s->site[i] == site)) i--;
        if (i < 0) return; /* not among this thread's calls */
        Py_DECREF(s->site[i]);
        memmove(s->site + i, s->site + i + 1, (size_t)(top - i) * sizeof(PyObject *));
        memmove(s->t0 + i, s->t0 + i + 1, (size_t)(top - i) * sizeof(int64_t));
    } else if (top < OPEN_DEPTH) {
        Py_DECREF(s->site[top]);
    }
    if (--s->depth == 0) {
        s->tid = 0;
        my_slot = NULL;
    }
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int grow(void) {
    Py_ssize_t cap = buf.cap ? buf.cap * 2 : 4096;
#define GROW(field, type)                                                   \
    do {                                                                    \
        type *p = PyMem_Realloc(buf.field, (size_t)cap * sizeof(type));     \
        if (!p) { PyErr_NoMemory(); return -1; }                            \
        buf.field = p;                                                      \
    } while (0)
    GROW(site, PyObject *);
    GROW(t0, int64_t);
    GROW(t1, int64_t);
    GROW(in_bytes, int64_t);
    GROW(out_bytes, int64_t);
    GROW(tid, uint64_t);
    GROW(status, uint8_t);
#undef GROW
    buf.cap = cap;
    return 0;
}

static int append(PyObject *site, int64_t t0, int64_t t1, uint64_t tid, int status,
                  int64_t in_bytes, int64_t out_bytes) {
    if (buf.len == buf.cap && grow() < 0) return -1;
    Py_ssize_t i = buf.len++;
    Py_INCREF(site);
    buf.site[i] = site;
    buf.t0[i] = t0;
    buf.t1[i] = t1;
    buf.tid[i] = tid;
    buf.status[i] = (uint8_t)status;
    buf.in_bytes[i] = in_bytes;
    buf.out_bytes[i] = out_bytes;
    if (recorded) (*recorded)++;
    return 0;
}

/* The GPU wait around a call (FECOMLITE_SYNC); a failing wait is the probe's, never the user's:
 * an exception in flight is kept as it was. */
static void gpu_sync(void) {
    if (!sync_call) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *done = PyObject_CallNoArgs(sync_call);
    if (done) Py_DECREF(done); else PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

/* fn(*args) timed: the fast path. */
static PyObject *timed_call(PyObject *site, PyObject *fn, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames, uint64_t tid) {
    gpu_sync();
    int64_t t0 = now_ns();
    open_push(tid, site, t0);
    PyObject *result = PyObject_Vectorcall(fn, args, nargs, kwnames);
    gpu_sync();
    int64_t t1 = now_ns();
    open_pop(site, t0);
    if (append(site, t0, t1, tid, result == NULL, -1, -1) < 0) {
        /* out of memory: the event is lost, the user's result is not */
        if (result) PyErr_Clear(); else return NULL;
    }
    return result;
}

static PyObject *as_tuple(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *tuple = PyTuple_New(nargs);
    for (Py_ssize_t i = 0; tuple && i < nargs; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    return tuple;
}

static PyObject *as_kwargs(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *kwargs = PyDict_New();
    if (!kwargs || !kwnames) return kwargs;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_DECREF(kwargs);
            return NULL;
        }
    }
    return kwargs;
}

/* after(...) with the call's outcome; whatever it does, the user's result or exception stands. */
static void call_after(PyObject *site, PyObject *fn, PyObject *prepared, PyObject *result,
                       int64_t t0, int64_t t1) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *t0o = PyLong_FromLongLong(t0), *t1o = PyLong_FromLongLong(t1);
    PyObject *done = NULL;
    if (t0o && t1o)
        done = PyObject_CallFunctionObjArgs(
            after_call, site, fn, PyTuple_GET_ITEM(prepared, 0), PyTuple_GET_ITEM(prepared, 1),
            result ? result : Py_None, result ? Py_False : Py_True, t0o, t1o,
            PyTuple_GET_ITEM(prepared, 2), NULL);
    if (done) Py_DECREF(done); else PyErr_Clear();
    Py_XDECREF(t0o);
    Py_XDECREF(t1o);
    PyErr_Restore(type, value, tb);
}

/* The sized path: before(), then fn called from here (no Python frame of the probe in between),
 * then after(). before() answering None (a tracer's call), or failing, leaves the fast path. */
static PyObject *sized_call(PyObject *site, PyObject *fn, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames, uint64_t tid) {
    PyObject *tuple = as_tuple(args, nargs);
    PyObject *kwargs = tuple ? as_kwargs(args, nargs, kwnames) : NULL;
    PyObject *prepared = NULL;
    if (kwargs)
        prepared = PyObject_CallFunctionObjArgs(before_call, site, fn, tuple, kwargs, NULL);
    Py_XDECREF(tuple);
    Py_XDECREF(kwargs);
    if (!prepared) PyErr_Clear();
    if (!prepared || !PyTuple_CheckExact(prepared) || PyTuple_GET_SIZE(prepared) != 3 ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(prepared, 0)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(prepared, 1))) {
        Py_XDECREF(prepared);
        return timed_call(site, fn, args, nargs, kwnames, tid);
    }
    int64_t t0 = now_ns();
    open_push(tid, site, t0);
    PyObject *result = PyObject_Call(fn, PyTuple_GET_ITEM(prepared, 0),
                                     PyTuple_GET_ITEM(prepared, 1));
    int64_t t1 = now_ns();
    open_pop(site, t0);
    call_after(site, fn, prepared, result, t0, t1);
    Py_DECREF(prepared);
    return result;
}

static PyObject *probe_call_at(PyObject *site, PyObject *fn, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames) {
    uint64_t tid = PyThread_get_thread_ident();
    if (before_call && after_call && (!fast_sites || PySet_Contains(fast_sites, site) != 1))
        return sized_call(site, fn, args, nargs, kwnames, tid);
    return timed_call(site, fn, args, nargs, kwnames, tid);
}

/* call(site, fn, /, *args, **kwargs) -> fn(*args, **kwargs), timed. */
static PyObject *probe_call(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                            PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "call(site, fn, /, *args, **kwargs)");
        return NULL;
    }
    return probe_call_at(args[0], args[1], args + 2, nargs - 2, kwnames);
}

/* What a dcall site's decision holds for: the function itself (a plain or bound method's
 * function, a class), the receiver's type for a C method, else the callable object's type. A
 * borrowed reference. */
static PyObject *callee_key(PyObject *fn) {
    if (PyMethod_Check(fn)) return PyMethod_GET_FUNCTION(fn);
    if (PyCFunction_Check(fn)) {
        PyObject *owner = PyCFunction_GET_SELF(fn);
        return owner && !PyModule_Check(owner) ? (PyObject *)Py_TYPE(owner) : fn;
    }
    if (PyFunction_Check(fn) || PyType_Check(fn)) return fn;
    return (PyObject *)Py_TYPE(fn);
}

/* A direct-mapped cache in front of `decisions`, by the site object's address (a site key is
 * a constant of the user's code: one object per site): a hit is two compares. A slot holds
 * references to its site and key, so neither address can be reused while it is cached. */
#define DCACHE_SLOTS 4096
typedef struct {
    PyObject *site, *key;
    int yes;
} DecisionSlot;
static DecisionSlot dcache[DCACHE_SLOTS];

static inline DecisionSlot *dslot(PyObject *site) {
    return &dcache[((uintptr_t)site >> 4) & (DCACHE_SLOTS - 1)];
}

static void dcache_put(PyObject *site, PyObject *key, int yes) {
    DecisionSlot *slot = dslot(site);
    Py_INCREF(site);
    Py_INCREF(key);
    Py_XSETREF(slot->site, site);
    Py_XSETREF(slot->key, key);
    slot->yes = yes;
}

static void dcache_clear(void) {
    for (size_t i = 0; i < DCACHE_SLOTS; i++) {
        Py_CLEAR(dcache[i].site);
        Py_CLEAR(dcache[i].key);
    }
}

/* Whether fn is a framework API (decide(fn)), remembered for the site; a failure is "no". */
static int decided(PyObject *site, PyObject *fn, PyObject *key) {
    DecisionSlot *slot = dslot(site);
    if (slot->site == site && slot->key == key) return slot->yes;
    PyObject *entry = PyDict_GetItemWithError(decisions, site);
    if (entry && PyTuple_GET_ITEM(entry, 0) == key) {
        int yes = PyTuple_GET_ITEM(entry, 1) == Py_True;
        dcache_put(site, key, yes);
        return yes;
    }
    PyErr_Clear();
    PyObject *answer = decide_call ? PyObject_CallOneArg(decide_call, fn) : NULL;
    int yes = answer ? PyObject_IsTrue(answer) == 1 : 0;
    Py_XDECREF(answer);
    PyErr_Clear();
    PyObject *fresh = PyTuple_Pack(2, key, yes ? Py_True : Py_False);
    if (!fresh || PyDict_SetItem(decisions, site, fresh) < 0) PyErr_Clear();
    Py_XDECREF(fresh);
    dcache_put(site, key, yes);
    return yes;
}

/* dcall(site, fn, /, *args, **kwargs): `call` for a framework callee, else fn(*args) as is. */
static PyObject *probe_dcall(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                             PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "dcall(site, fn, /, *args, **kwargs)");
        return NULL;
    }
    PyObject *site = args[0], *fn = args[1];
    if (decisions && decided(site, fn, callee_key(fn)))
        return probe_call_at(site, fn, args + 2, nargs - 2, kwnames);
    return PyObject_Vectorcall(fn, args + 2, nargs - 2, kwnames);
}

/* forget_decisions(): look at every dcall site's callee again (tests force the first call). */
static PyObject *probe_forget_decisions(PyObject *self, PyObject *unused) {
    if (decisions) PyDict_Clear(decisions);
    dcache_clear();
    Py_RETURN_NONE;
}

/* record(site, t0, t1, status=0, in_bytes=-1, out_bytes=-1, tid=0): tid 0 is this thread; another
   names the thread the span belongs to (a backward span run on autograd's device thread) */
static PyObject *probe_record(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"site", "t0", "t1", "status", "in_bytes", "out_bytes", "tid", NULL};
    PyObject *site;
    long long t0, t1, in_bytes = -1, out_bytes = -1;
    unsigned long long tid = 0;
    int status = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLL|iLLK", kwlist, &site, &t0, &t1, &status,
                                     &in_bytes, &out_bytes, &tid))
        return NULL;
    if (tid == 0) tid = PyThread_get_thread_ident();
    if (append(site, t0, t1, (uint64_t)tid, status, in_bytes, out_bytes) < 0) return NULL;
    Py_RETURN_NONE;
}

/* drain() -> (site_names, site_index int32, t0, t1, tid, status, in_bytes, out_bytes) as bytes */
static PyObject *probe_drain(PyObject *self, PyObject *unused) {
    Py_ssize_t n = buf.len;
    PyObject *names = PyList_New(0), *index = PyDict_New(), *out = NULL;
    PyObject *idx_bytes = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (!names || !index || !idx_bytes) goto done;
    int32_t *idx = (int32_t *)PyBytes_AS_STRING(idx_bytes);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *found = PyDict_GetItemWithError(index, buf.site[i]);
        if (found) {
            idx[i] = (int32_t)PyLong_AsLong(found);
            continue;
        }
        if (PyErr_Occurred()) goto done;
        PyObject *k = PyLong_FromSsize_t(PyList_GET_SIZE(names));
        if (!k || PyDict_SetItem(index, buf.site[i], k) < 0 || PyList_Append(names, buf.site[i]) < 0) {
            Py_XDECREF(k);
            goto done;
        }
        idx[i] = (int32_t)PyLong_AsLong(k);
        Py_DECREF(k);
    }
    out = Py_BuildValue(
        "(OOy#y#y#y#y#y#)", names, idx_bytes,
        (const char *)buf.t0, n * (Py_ssize_t)sizeof(int64_t),
        (const char *)buf.t1, n * (Py_ssize_t)sizeof(int64_t),
        (const char *)buf.tid, n * (Py_ssize_t)sizeof(uint64_t),
        (const char *)buf.status, n,
        (const char *)buf.in_bytes, n * (Py_ssize_t)sizeof(int64_t),
        (const char *)buf.out_bytes, n * (Py_ssize_t)sizeof(int64_t));
    if (out) {
        for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(buf.site[i]);
        buf.len = 0;
    }
done:
    Py_XDECREF(names);
    Py_XDECREF(index);
    Py_XDECREF(idx_bytes);
    return out;
}

static PyObject *probe_discard(PyObject *self, PyObject *unused) {
    for (Py_ssize_t i = 0; i < buf.len; i++) Py_DECREF(buf.site[i]);
    buf.len = 0;
    Py_RETURN_NONE;
}

/* open_calls() -> [(tid, depth, [(site, t0), ...] outermost first)] for every thread in a call */
static PyObject *probe_open_calls(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (size_t k = 0; k < OPEN_SLOTS; k++) {
        OpenSlot *s = &open_slots[k];
        if (s->tid == 0 || s->depth <= 0) continue;
        Py_ssize_t shown = s->depth < OPEN_DEPTH ? s->depth : OPEN_DEPTH;
        PyObject *stack = PyList_New(shown);
        if (!stack) goto fail;
        for (Py_ssize_t i = 0; i < shown; i++) {
            PyObject *item = Py_BuildValue("(OL)", s->site[i], (long long)s->t0[i]);
            if (!item) { Py_DECREF(stack); goto fail; }
            PyList_SET_ITEM(stack, i, item);
        }
        PyObject *entry = Py_BuildValue("(KnN)", (unsigned long long)s->tid, s->depth, stack);
        if (!entry || PyList_Append(out, entry) < 0) { Py_XDECREF(entry); goto fail; }
        Py_DECREF(entry);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* forget_open(): a forked child runs none of its parent's calls (its threads are gone, and the
 * forking thread's calls, like a worker's, usually never return there). */
static PyObject *probe_forget_open(PyObject *self, PyObject *unused) {
    for (size_t k = 0; k < OPEN_SLOTS; k++) {
        OpenSlot *s = &open_slots[k];
        for (Py_ssize_t i = 0; s->tid && i < s->depth && i < OPEN_DEPTH; i++) Py_DECREF(s->site[i]);
    }
    memset(open_slots, 0, sizeof(open_slots));
    open_generation++;
    Py_RETURN_NONE;
}

static PyObject *probe_pending(PyObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(buf.len);
}

/* configure(fast_sites, before, after, sync=None, decide=None) */
static PyObject *probe_configure(PyObject *self, PyObject *args) {
    PyObject *fast, *before, *after, *sync = Py_None, *decide = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|OO", &fast, &before, &after, &sync, &decide)) return NULL;
    if (!PyAnySet_Check(fast)) {
        PyErr_SetString(PyExc_TypeError, "fast sites must be a set");
        return NULL;
    }
    if (!decisions && !(decisions = PyDict_New())) return NULL;
    Py_XSETREF(fast_sites, Py_NewRef(fast));
    Py_XSETREF(before_call, Py_NewRef(before));
    Py_XSETREF(after_call, Py_NewRef(after));
    Py_XSETREF(sync_call, sync == Py_None ? NULL : Py_NewRef(sync));
    Py_XSETREF(decide_call, decide == Py_None ? NULL : Py_NewRef(decide));
    PyDict_Clear(decisions);
    dcache_clear();
    Py_RETURN_NONE;
}

/* set_counter(buffer or None): count each recorded event in the first 8 bytes of a writable
 * buffer (an mmap of the run's counter file); None stops counting. */
static PyObject *probe_set_counter(PyObject *self, PyObject *target) {
    Py_buffer view;
    if (target != Py_None) {
        if (PyObject_GetBuffer(target, &view, PyBUF_WRITABLE) < 0) return NULL;
        if (view.len < (Py_ssize_t)sizeof(uint64_t) || ((uintptr_t)view.buf & 7)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "the counter needs 8 aligned writable bytes");
            return NULL;
        }
    }
    if (recorded) PyBuffer_Release(&recorded_view);
    recorded = NULL;
    if (target != Py_None) {
        recorded_view = view;
        recorded = (volatile uint64_t *)view.buf;
    }
    Py_RETURN_NONE;
}

static PyObject *probe_now(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(now_ns());
}


/* Region: `with region:` of the user's own code (fecomlite/runtime/regions.py subclasses it). Entering
 * pushes (thread, now) on the object's own stack; leaving pops this thread's latest start and
 * appends the span like a call, so a region costs about a probe instead of a Python
 * enter/exit pair and a Python record (~1.3 µs). One object may be entered recursively and from
 * several threads: each exit takes the latest start of its own thread. */
typedef struct {
    PyObject_HEAD
    PyObject *site;
    int64_t *start;
    uint64_t *start_tid;
    Py_ssize_t depth, cap;
} Region;

static int region_init(Region *self, PyObject *args, PyObject *kwds) {
    PyObject *site;
    if (!PyArg_ParseTuple(args, "U", &site)) return -1;
    Py_INCREF(site);
    Py_XSETREF(self->site, site);
    return 0;
}

static void region_dealloc(Region *self) {
    Py_XDECREF(self->site);
    PyMem_Free(self->start);
    PyMem_Free(self->start_tid);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *region_enter(Region *self, PyObject *unused) {
    if (self->depth == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 8;
        int64_t *s = PyMem_Realloc(self->start, (size_t)cap * sizeof(int64_t));
        if (!s) return PyErr_NoMemory();
        self->start = s;
        uint64_t *t = PyMem_Realloc(self->start_tid, (size_t)cap * sizeof(uint64_t));
        if (!t) return PyErr_NoMemory();
        self->start_tid = t;
        self->cap = cap;
    }
    self->start_tid[self->depth] = PyThread_get_thread_ident();
    self->start[self->depth++] = now_ns();
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *region_exit(Region *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t t1 = now_ns();
    uint64_t tid = PyThread_get_thread_ident();
    Py_ssize_t i = self->depth - 1;
    while (i >= 0 && self->start_tid[i] != tid) i--;
    if (i < 0 || self->site == NULL) Py_RETURN_NONE; /* never entered on this thread */
    int64_t t0 = self->start[i];
    memmove(self->start + i, self->start + i + 1, (size_t)(self->depth - i - 1) * sizeof(int64_t));
    memmove(self->start_tid + i, self->start_tid + i + 1,
            (size_t)(self->depth - i - 1) * sizeof(uint64_t));
    self->depth--;
    int raised = nargs > 0 && args[0] != Py_None;
    if (append(self->site, t0, t1, tid, raised, -1, -1) < 0) PyErr_Clear(); /* lose the event */
    Py_RETURN_NONE;
}

static PyObject *region_get_site(Region *self, void *closure) {
    if (!self->site) Py_RETURN_NONE;
    Py_INCREF(self->site);
    return self->site;
}

static PyMethodDef region_methods[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, "Start the span."},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL,
     "End this thread's latest span and record it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef region_getset[] = {
    {"site", (getter)region_get_site, NULL, "the site key the span is recorded under", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fecomlite.runtime._fastprobe.Region",
    .tp_basicsize = sizeof(Region),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Region(site): a span of user code recorded like a call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)region_init,
    .tp_dealloc = (destructor)region_dealloc,
    .tp_methods = region_methods,
    .tp_getset = region_getset,
};

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))probe_call, METH_FASTCALL | METH_KEYWORDS,
     "call(site, fn, /, *args, **kwargs): call fn and record when it ran."},
    {"dcall", (PyCFunction)(void (*)(void))probe_dcall, METH_FASTCALL | METH_KEYWORDS,
     "dcall(site, fn, /, *args, **kwargs): `call` when fn is a framework API (decided once per "
     "site and callee), else fn(*args, **kwargs) untouched."},
    {"forget_decisions", probe_forget_decisions, METH_NOARGS,
     "Decide every dcall site's callee again on its next call."},
    {"record", (PyCFunction)(void (*)(void))probe_record, METH_VARARGS | METH_KEYWORDS,
     "record(site, t0, t1, status=0, in_bytes=-1, out_bytes=-1, tid=0): append one event "
     "(tid 0: this thread's)."},
    {"drain", probe_drain, METH_NOARGS, "Take every buffered event as columns."},
    {"discard", probe_discard, METH_NOARGS, "Drop every buffered event (a forked child)."},
    {"pending", probe_pending, METH_NOARGS, "Number of buffered events."},
    {"open_calls", probe_open_calls, METH_NOARGS,
     "The calls in progress: [(tid, depth, [(site, t0_ns), ...] outermost first)]."},
    {"forget_open", probe_forget_open, METH_NOARGS, "Clear the calls in progress (a forked child)."},
    {"configure", probe_configure, METH_VARARGS,
     "configure(fast_sites, before, after, sync=None, decide=None): the sized path's helpers "
     "for sites not in fast_sites, the GPU wait around every call, and dcall's judge."},
    {"set_counter", probe_set_counter, METH_O,
     "set_counter(buffer or None): count recorded events in its first 8 bytes (shared memory)."},
    {"now", probe_now, METH_NOARGS, "CLOCK_MONOTONIC in ns (time.monotonic_ns)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastprobe", "The probe's hot path in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__fastprobe(void) {
    if (PyType_Ready(&RegionType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RegionType);
    if (PyModule_AddObject(m, "Region", (PyObject *)&RegionType) < 0) {
        Py_DECREF(&RegionType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
