/* The sampler's clock in C: a thread that wakes on a grid of ticks and `pread`s kernel files.
 *
 * Why C: on a VM a Python thread that wakes at 200 Hz pays ~35 us a wake-up and then runs its
 * interpreter on cold caches; that, not the reads, was most of the server's CPU while recording.
 * This thread never takes the GIL: each tick it reads the files that are due into one byte
 * buffer (a record each: tick, time, key, content or -errno), and Python drains the buffer a few
 * times a second, a (time, {key: content}) per tick, and decodes it with the sensors' own code
 * (fecomlite/server/capture.py). Ticks are absolute (no drift); a late tick is read at once and
 * the missed ones are skipped, never made up in a burst.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BUFFER (64u << 20) /* by default; beyond it records are dropped (and counted) */

typedef struct {
    int64_t key;   /* the caller's name for the file */
    int fd;        /* our own dup: a descriptor the caller closes (and reuses) is never read */
    int64_t every; /* ticks */
    int64_t next;  /* the next tick it is due at */
    int size;      /* bytes read at most */
} Entry;

typedef struct {
    int64_t k, t_ns, key;
    int32_t len; /* < 0: -errno */
} Header;

typedef struct {
    PyObject_HEAD
    int64_t tick_ns;
    pthread_mutex_t lock; /* guards plan, buffer, dropped */
    Entry *plan;
    Py_ssize_t n_plan;
    char *buffer;
    size_t used, cap, max_buffer;
    uint64_t dropped;
    pthread_t thread;
    pid_t pid; /* the process this state belongs to: a forked child has no thread, and the
                  lock may have been held by one at the fork */
    int running;
    volatile int stopping;
    char *scratch;
} Ticker;

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Called first by every method: in a forked child, no thread ticks and the lock is reset. */
static void own(Ticker *self) {
    if (self->pid == getpid()) return;
    self->pid = getpid();
    pthread_mutex_init(&self->lock, NULL);
    self->running = 0;
}

static int ticking(Ticker *self) {
    own(self);
    return self->running;
}

static void append(Ticker *self, int64_t k, int64_t t_ns, int64_t key, const char *data,
                   int len) {
    size_t need = sizeof(Header) + (len > 0 ? (size_t)len : 0);
    if (self->used + need > self->cap) {
        size_t cap = self->cap ? self->cap : 65536;
        while (cap < self->used + need) cap *= 2;
        if (cap > self->max_buffer) cap = self->max_buffer;
        char *grown = cap >= self->used + need ? realloc(self->buffer, cap) : NULL;
        if (!grown) {
            self->dropped++;
            return;
        }
        self->buffer = grown;
        self->cap = cap;
    }
    Header h = {k, t_ns, key, len};
    memcpy(self->buffer + self->used, &h, sizeof h);
    if (len > 0) memcpy(self->buffer + self->used + sizeof h, data, (size_t)len);
    self->used += need;
}

static void *run(void *arg) {
    Ticker *self = arg;
    pthread_mutex_lock(&self->lock); /* tick 0 is now: every entry is due at once */
    for (Py_ssize_t i = 0; i < self->n_plan; i++) self->plan[i].next = 0;
    pthread_mutex_unlock(&self->lock);
    int64_t start = now_ns(), k = 0;
    while (!self->stopping) {
        int64_t due = start + k * self->tick_ns;
        struct timespec ts = {(time_t)(due / 1000000000LL), (long)(due % 1000000000LL)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        if (self->stopping) break;
        pthread_mutex_lock(&self->lock);
        for (Py_ssize_t i = 0; i < self->n_plan; i++) {
            Entry *e = &self->plan[i];
            if (e->next > k) continue;
            e->next = k + e->every;
            int64_t t0 = now_ns();
            ssize_t n = pread(e->fd, self->scratch, (size_t)e->size, 0);
            int64_t t1 = now_ns();
            append(self, k, (t0 + t1) / 2, e->key, self->scratch, n < 0 ? -errno : (int)n);
        }
        pthread_mutex_unlock(&self->lock);
        int64_t late = (now_ns() - start) / self->tick_ns;
        k = late > k + 1 ? late : k + 1;
    }
    return NULL;
}

static int Ticker_init(Ticker *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"tick_ns", "max_buffer", NULL};
    long long tick_ns;
    Py_ssize_t max_buffer = MAX_BUFFER;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L|$n", kwlist, &tick_ns, &max_buffer))
        return -1;
    if (max_buffer < 0) {
        PyErr_SetString(PyExc_ValueError, "max_buffer must not be negative");
        return -1;
    }
    if (tick_ns < 100000) {
        PyErr_SetString(PyExc_ValueError, "tick_ns must be at least 100 us");
        return -1;
    }
    if (ticking(self)) {
        PyErr_SetString(PyExc_RuntimeError, "the ticker is running");
        return -1;
    }
    self->tick_ns = tick_ns;
    self->max_buffer = (size_t)max_buffer;
    return 0;
}

static PyObject *Ticker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Ticker *self = (Ticker *)type->tp_alloc(type, 0);
    if (self) {
        pthread_mutex_init(&self->lock, NULL);
        self->pid = getpid();
    }
    return (PyObject *)self;
}

static void stop_thread(Ticker *self) {
    if (!ticking(self)) return;
    self->stopping = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->running = 0;
}

static void close_plan(Entry *plan, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) close(plan[i].fd);
    free(plan);
}

static void Ticker_dealloc(Ticker *self) {
    stop_thread(self);
    close_plan(self->plan, self->n_plan);
    free(self->buffer);
    free(self->scratch);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void lock(Ticker *self) {
    own(self);
    if (pthread_mutex_trylock(&self->lock) == 0) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    Py_END_ALLOW_THREADS
}

/* The plan from [(key, fd, every, size)], each fd dup'ed; NULL with an exception set. */
static Entry *parse_plan(PyObject *entries, Py_ssize_t *n, int *largest) {
    PyObject *seq = PySequence_Fast(entries, "plan: a sequence of (key, fd, every, size)");
    if (!seq) return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    *largest = 1;
    Entry *plan = calloc((size_t)(*n ? *n : 1), sizeof(Entry));
    if (!plan) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t made = 0;
    for (; made < *n; made++) {
        long long key, every;
        int fd, size;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, made), "LiLi", &key, &fd, &every,
                              &size))
            break;
        if (fd < 0 || every < 1 || size < 1) {
            PyErr_SetString(PyExc_ValueError, "plan: fd >= 0, every >= 1 and size >= 1");
            break;
        }
        int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            break;
        }
        plan[made] = (Entry){key, own, every, 0, size};
        if (size > *largest) *largest = size;
    }
    Py_DECREF(seq);
    if (made < *n) {
        close_plan(plan, made);
        return NULL;
    }
    return plan;
}

static PyObject *Ticker_set_plan(Ticker *self, PyObject *entries) {
    Py_ssize_t n;
    int largest;
    Entry *plan = parse_plan(entries, &n, &largest);
    if (!plan) return NULL;
    char *scratch = malloc((size_t)largest);
    if (!scratch) {
        close_plan(plan, n);
        return PyErr_NoMemory();
    }
    lock(self);
    Entry *old = self->plan;
    Py_ssize_t n_old = self->n_plan;
    char *old_scratch = self->scratch;
    self->plan = plan;
    self->n_plan = n;
    self->scratch = scratch;
    pthread_mutex_unlock(&self->lock);
    close_plan(old, n_old);
    free(old_scratch);
    Py_RETURN_NONE;
}

static PyObject *Ticker_start(Ticker *self, PyObject *unused) {
    if (ticking(self)) Py_RETURN_NONE;
    self->stopping = 0;
    int err = pthread_create(&self->thread, NULL, run, self);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->running = 1;
    Py_RETURN_NONE;
}

static PyObject *Ticker_stop(Ticker *self, PyObject *unused) {
    stop_thread(self);
    Py_RETURN_NONE;
}

/* One tick's records as (t_ns, {key: bytes or errno}); t_ns is the middle of its reads. */
static PyObject *tick_of(const char *at, const char *end, const char **next) {
    Header first;
    memcpy(&first, at, sizeof first);
    int64_t t_last = first.t_ns;
    PyObject *contents = PyDict_New();
    while (contents && at < end) {
        Header h;
        memcpy(&h, at, sizeof h);
        if (h.k != first.k) break;
        at += sizeof h;
        PyObject *key = PyLong_FromLongLong(h.key);
        PyObject *content = h.len >= 0 ? PyBytes_FromStringAndSize(at, h.len)
                                       : PyLong_FromLong(-h.len);
        if (!key || !content || PyDict_SetItem(contents, key, content) < 0) Py_CLEAR(contents);
        Py_XDECREF(key);
        Py_XDECREF(content);
        if (h.len > 0) at += h.len;
        t_last = h.t_ns;
    }
    *next = at;
    if (!contents) return NULL;
    return Py_BuildValue("(LN)", (long long)(first.t_ns + (t_last - first.t_ns) / 2), contents);
}

static PyObject *Ticker_drain(Ticker *self, PyObject *unused) {
    lock(self);
    char *taken = self->buffer;
    size_t used = self->used;
    self->buffer = NULL;
    self->used = self->cap = 0;
    pthread_mutex_unlock(&self->lock);
    PyObject *out = PyList_New(0);
    const char *at = taken, *end = taken + used;
    while (out && at < end) {
        PyObject *tick = tick_of(at, end, &at);
        if (!tick || PyList_Append(out, tick) < 0) Py_CLEAR(out);
        Py_XDECREF(tick);
    }
    free(taken);
    return out;
}

static PyObject *Ticker_get_dropped(Ticker *self, void *closure) {
    lock(self);
    uint64_t dropped = self->dropped;
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromUnsignedLongLong(dropped);
}

static PyObject *Ticker_get_running(Ticker *self, void *closure) {
    return PyBool_FromLong(ticking(self));
}

static PyMethodDef Ticker_methods[] = {
    {"set_plan", (PyCFunction)Ticker_set_plan, METH_O,
     "Replace the plan: [(key, fd, every n ticks, bytes to read)]; each entry is due at the next\n"
     "tick. The descriptors are dup'ed: the caller may close its own at any time."},
    {"start", (PyCFunction)Ticker_start, METH_NOARGS, "Start ticking on a thread (tick 0 now)."},
    {"stop", (PyCFunction)Ticker_stop, METH_NOARGS, "Stop ticking; wait for the thread."},
    {"drain", (PyCFunction)Ticker_drain, METH_NOARGS,
     "Everything read since the last drain, tick by tick: [(t_ns, {key: bytes or errno})], t_ns\n"
     "the middle of that tick's reads."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ticker_getset[] = {
    {"dropped", (getter)Ticker_get_dropped, NULL, "records lost to a full buffer", NULL},
    {"running", (getter)Ticker_get_running, NULL, "whether the thread ticks", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TickerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fecomlite.server._ticker.Ticker",
    .tp_doc = "Reads kernel files on a grid of ticks, on a thread of its own, without the GIL.",
    .tp_basicsize = sizeof(Ticker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Ticker_new,
    .tp_init = (initproc)Ticker_init,
    .tp_dealloc = (destructor)Ticker_dealloc,
    .tp_methods = Ticker_methods,
    .tp_getset = Ticker_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ticker", "The sampler's tick thread (see Ticker).", -1, NULL,
};

PyMODINIT_FUNC PyInit__ticker(void) {
    if (PyType_Ready(&TickerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&TickerType);
    if (PyModule_AddObject(m, "Ticker", (PyObject *)&TickerType) < 0) {
        Py_DECREF(&TickerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
