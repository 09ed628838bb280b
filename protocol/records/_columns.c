/* Records of one RecordBatch v2 as Arrow column buffers, for readers that build Arrow
 * batches (the Spark source): no Python object per record.
 *
 * record_columns(records, count, base_offset, base_timestamp, log_append_time, first, last)
 *   -> (rows, offsets, timestamps, key_validity, key_offsets, key_data,
 *       value_validity, value_offsets, value_data)
 *
 * `records` is the batch's records section, decompressed; `count` its recordsCount. Only
 * records whose offset lies in [first, last] are kept. `offsets` and `timestamps` are
 * little-endian int64 arrays (timestamps in ms: base_timestamp + timestampDelta, or
 * `log_append_time` for every record unless it is None); keys and values are Arrow
 * binary arrays: a validity bitmap (None when no value is null), int32 offsets, data.
 * Headers are skipped. A malformed record raises ValueError naming it and its byte. The
 * record layout is in `decoder.py`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Arrow buffers are written in the host's byte order: little-endian hosts only"
#endif

#define VARINT_BYTES 5
#define VARLONG_BYTES 10

/* One zig-zag varint of at most max_bytes bytes, all before limit; 0, or -1 if malformed. */
static inline int read_varint(const uint8_t *data, Py_ssize_t *position, Py_ssize_t limit,
                              int max_bytes, int64_t *value) {
    uint64_t raw = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++, shift += 7) {
        if (*position >= limit)
            return -1;
        uint64_t byte = data[(*position)++];
        raw |= (byte & 0x7F) << shift;
        if (byte < 0x80) {
            *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    return -1;
}

/* One binary column being built: validity bits, offsets, data. */
typedef struct {
    PyObject *validity, *offsets, *data;
    Py_ssize_t size; /* bytes of data so far */
    int nulls;
} column;

static int column_init(column *c, Py_ssize_t rows, Py_ssize_t data_bytes) {
    c->validity = PyBytes_FromStringAndSize(NULL, (rows + 7) / 8);
    c->offsets = PyBytes_FromStringAndSize(NULL, (rows + 1) * 4);
    c->data = PyBytes_FromStringAndSize(NULL, data_bytes);
    c->size = 0;
    c->nulls = 0;
    if (!c->validity || !c->offsets || !c->data)
        return -1;
    memset(PyBytes_AS_STRING(c->validity), 0, (size_t)((rows + 7) / 8));
    memset(PyBytes_AS_STRING(c->offsets), 0, 4);
    return 0;
}

static void column_clear(column *c) {
    Py_CLEAR(c->validity);
    Py_CLEAR(c->offsets);
    Py_CLEAR(c->data);
}

/* Append value `row` (length -1: null). */
static inline void column_add(column *c, Py_ssize_t row, const uint8_t *bytes, int64_t length) {
    if (length < 0) {
        c->nulls = 1;
    } else {
        PyBytes_AS_STRING(c->validity)[row / 8] |= (char)(1 << (row % 8));
        memcpy(PyBytes_AS_STRING(c->data) + c->size, bytes, (size_t)length);
        c->size += (Py_ssize_t)length;
    }
    int32_t end = (int32_t)c->size;
    memcpy(PyBytes_AS_STRING(c->offsets) + (row + 1) * 4, &end, 4);
}

/* Shrink to `rows` rows; the validity bitmap becomes None when nothing is null. */
static int column_finish(column *c, Py_ssize_t rows) {
    if (_PyBytes_Resize(&c->offsets, (rows + 1) * 4) < 0 || _PyBytes_Resize(&c->data, c->size) < 0)
        return -1;
    if (!c->nulls) {
        Py_DECREF(c->validity);
        c->validity = Py_NewRef(Py_None);
    } else if (_PyBytes_Resize(&c->validity, (rows + 7) / 8) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *malformed(Py_ssize_t record, Py_ssize_t at, const char *what) {
    PyErr_Format(PyExc_ValueError, "record %zd at byte %zd: %s", record, at, what);
    return NULL;
}

static PyObject *columns(const uint8_t *data, Py_ssize_t end, Py_ssize_t count,
                         int64_t base_offset, int64_t base_timestamp, int log_append,
                         int64_t log_append_time, int64_t first, int64_t last) {
    column keys = {0}, values = {0};
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, count * 8);
    PyObject *timestamps = PyBytes_FromStringAndSize(NULL, count * 8);
    PyObject *result = NULL;
    if (!offsets || !timestamps || column_init(&keys, count, end) < 0 ||
        column_init(&values, count, end) < 0)
        goto done;
    Py_ssize_t position = 0, rows = 0;
    for (Py_ssize_t record = 0; record < count; record++) {
        Py_ssize_t at = position;
        int64_t length, timestamp_delta, offset_delta, key_length, value_length;
        if (read_varint(data, &position, end, VARINT_BYTES, &length) || length < 0 ||
            length > end - position) {
            malformed(record, at, "bad length");
            goto done;
        }
        Py_ssize_t record_end = position + (Py_ssize_t)length;
        position += 1; /* attributes */
        if (read_varint(data, &position, record_end, VARLONG_BYTES, &timestamp_delta) ||
            read_varint(data, &position, record_end, VARINT_BYTES, &offset_delta)) {
            malformed(record, at, "bad timestampDelta or offsetDelta");
            goto done;
        }
        if (read_varint(data, &position, record_end, VARINT_BYTES, &key_length) ||
            key_length < -1 || key_length > record_end - position) {
            malformed(record, at, "bad key length");
            goto done;
        }
        const uint8_t *key = data + position;
        position += key_length > 0 ? (Py_ssize_t)key_length : 0;
        if (read_varint(data, &position, record_end, VARINT_BYTES, &value_length) ||
            value_length < -1 || value_length > record_end - position) {
            malformed(record, at, "bad value length");
            goto done;
        }
        const uint8_t *value = data + position;
        position = record_end; /* headers: skipped */
        int64_t offset = base_offset + offset_delta;
        if (offset < first || offset > last)
            continue;
        int64_t timestamp = log_append ? log_append_time : base_timestamp + timestamp_delta;
        memcpy(PyBytes_AS_STRING(offsets) + rows * 8, &offset, 8);
        memcpy(PyBytes_AS_STRING(timestamps) + rows * 8, &timestamp, 8);
        column_add(&keys, rows, key, key_length);
        column_add(&values, rows, value, value_length);
        rows++;
    }
    if (position != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left in the records section after %zd records",
                     end - position, count);
        goto done;
    }
    if (_PyBytes_Resize(&offsets, rows * 8) < 0 || _PyBytes_Resize(&timestamps, rows * 8) < 0 ||
        column_finish(&keys, rows) < 0 || column_finish(&values, rows) < 0)
        goto done;
    result = Py_BuildValue("(nOOOOOOOO)", rows, offsets, timestamps, keys.validity, keys.offsets,
                           keys.data, values.validity, values.offsets, values.data);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    column_clear(&keys);
    column_clear(&values);
    return result;
}

static PyObject *record_columns(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t count;
    long long base_offset, base_timestamp, first, last;
    PyObject *log_append_time;
    if (!PyArg_ParseTuple(args, "y*nLLOLL", &view, &count, &base_offset, &base_timestamp,
                          &log_append_time, &first, &last))
        return NULL;
    long long append_time = 0;
    int log_append = log_append_time != Py_None;
    if (log_append) {
        append_time = PyLong_AsLongLong(log_append_time);
        if (append_time == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyObject *result;
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "a negative record count: %zd", count);
        result = NULL;
    } else {
        result = columns((const uint8_t *)view.buf, view.len, count, base_offset, base_timestamp,
                         log_append, append_time, first, last);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"record_columns", record_columns, METH_VARARGS,
     "record_columns(records, count, base_offset, base_timestamp, log_append_time, first, last)"
     " -> (rows, offsets, timestamps, key_validity, key_offsets, key_data, value_validity,"
     " value_offsets, value_data)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columns", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
