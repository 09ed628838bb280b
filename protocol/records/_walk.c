/* The record walk of `validation.walk_records`, compiled: the produce path runs it on
 * every record, where the Python loop costs about 2.5 us a record and this about 6 ns
 * (100-byte values; the cost is per record, not per byte).
 *
 * walk_records(buffer, start, end, count, keyless=None)
 *     -> (min timestampDelta, max timestampDelta)
 * raises ValueError (message: which record, which byte, what is wrong) where the Python
 * version raises MalformedRecords, on exactly the same inputs: the property tests hold the
 * two to that. If `keyless` is a list, the index of each record with a null key is
 * appended to it (a compacted topic refuses those); with None, the default, the loop has
 * no key check. No read goes past `end`, nor past the end of the record being read; keys,
 * values and headers are skipped, never copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define VARINT_BYTES 5
#define VARLONG_BYTES 10
#define MIN_RECORD_BODY_BYTES 6

/* One zig-zag varint of at most max_bytes bytes, all before limit. A varint must fit
 * 32 bits and a varlong 64, as in the Python walker. Returns 0, or -1 if malformed. */
static inline int read_varint(const uint8_t *data, Py_ssize_t *position, Py_ssize_t limit,
                              int max_bytes, int64_t *value) {
    if (*position < limit && data[*position] < 0x80) { /* most deltas and short lengths */
        uint64_t raw = data[(*position)++];
        *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        return 0;
    }
    if (*position + 1 < limit && data[*position + 1] < 0x80) { /* lengths below 8 KiB */
        uint64_t raw = (data[*position] & 0x7F) | ((uint64_t)data[*position + 1] << 7);
        *position += 2;
        *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        return 0;
    }
    uint64_t raw = 0;
    int shift = 0;
    Py_ssize_t index = *position;
    for (int i = 0; i < max_bytes; i++, index++, shift += 7) {
        if (index >= limit)
            return -1;
        uint64_t byte = data[index];
        if (shift == 63 && (byte & 0x7E))
            return -1; /* bits past 64 */
        raw |= (byte & 0x7F) << shift;
        if (byte < 0x80) {
            if (max_bytes == VARINT_BYTES && (raw >> 32))
                return -1;
            *position = index + 1;
            *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    return -1;
}

/* What is wrong with a record, for the message; NULL if nothing is. */
typedef const char *fault;

/* The fields of one record after its length, in [position, record_end): attributes,
 * timestampDelta (stored in *timestamp_delta), offsetDelta (must be `expected`), key
 * (unless null_key is NULL, *null_key says whether its length is -1), value, headers,
 * ending exactly at record_end. */
static inline fault check_record(const uint8_t *data, Py_ssize_t position,
                                 Py_ssize_t record_end, Py_ssize_t expected,
                                 int64_t *timestamp_delta, int *null_key) {
    int64_t value;
    position += 1; /* attributes: unused in magic 2 */
    if (read_varint(data, &position, record_end, VARLONG_BYTES, timestamp_delta))
        return "bad timestampDelta";
    if (read_varint(data, &position, record_end, VARINT_BYTES, &value))
        return "bad offsetDelta";
    if (value != expected)
        return "offsetDelta out of sequence";
    for (int field = 0; field < 2; field++) { /* key, value */
        if (read_varint(data, &position, record_end, VARINT_BYTES, &value))
            return "bad key or value length";
        if (value < -1 || value > record_end - position)
            return "key or value length does not fit the record";
        if (null_key && field == 0)
            *null_key = value == -1;
        if (value > 0)
            position += (Py_ssize_t)value;
    }
    /* Most records have no headers: their last byte is a header count of 0 right after
     * the value. Read there, the load need not wait for the value's length. */
    if (position == record_end - 1 && data[record_end - 1] == 0)
        return NULL;
    if (read_varint(data, &position, record_end, VARINT_BYTES, &value))
        return "bad header count";
    if (value < 0 || 2 * value > record_end - position)
        return "header count does not fit the record";
    for (int64_t header = 0, headers = value; header < headers; header++) {
        for (int minimum = 0; minimum >= -1; minimum--) { /* key, then value */
            if (read_varint(data, &position, record_end, VARINT_BYTES, &value))
                return "bad header length";
            if (value < minimum || value > record_end - position)
                return "header length does not fit the record";
            if (value > 0)
                position += (Py_ssize_t)value;
        }
    }
    if (position != record_end)
        return "its fields do not end where its length says";
    return NULL;
}

/* Append `index` to `list`: 0, or -1 with the exception set. */
static int append_index(PyObject *list, Py_ssize_t index) {
    PyObject *item = PyLong_FromSsize_t(index);
    if (!item)
        return -1;
    int appended = PyList_Append(list, item);
    Py_DECREF(item);
    return appended;
}

static PyObject *malformed(Py_ssize_t record, Py_ssize_t at, const char *what) {
    PyErr_Format(PyExc_ValueError, "record %zd at byte %zd: %s", record, at, what);
    return NULL;
}

/* The next record starts where this one's length says, so each iteration depends on the
 * previous one through one varint only, and the CPU checks several records at once.
 * `keyless`: a list for the indices of records with a null key, or NULL. Inlined at two
 * calls, one with NULL, where the compiler drops the key check from the loop: the produce
 * path of a topic that is not compacted does not check keys. */
static inline Py_ALWAYS_INLINE PyObject *walk(const uint8_t *data, Py_ssize_t start,
                                              Py_ssize_t end, Py_ssize_t count,
                                              PyObject *keyless) {
    Py_ssize_t position = start;
    int64_t min_delta = INT64_MAX, max_delta = INT64_MIN, length, timestamp_delta;
    int null_key = 0; /* set only where there is a list for it */
    if (count == 0) {
        if (start != end)
            return malformed(0, 0, "bytes in the records section of 0 records");
        return Py_BuildValue("(LL)", (long long)0, (long long)0);
    }
    for (Py_ssize_t expected = 0; expected < count; expected++) {
        Py_ssize_t at = position - start;
        if (position >= end)
            return malformed(expected, at, "the records section ends before it");
        if (read_varint(data, &position, end, VARINT_BYTES, &length))
            return malformed(expected, at, "bad length varint");
        if (length < MIN_RECORD_BODY_BYTES || length > end - position)
            return malformed(expected, at, "length does not fit the records section");
        Py_ssize_t record_end = position + (Py_ssize_t)length;
        fault wrong = check_record(data, position, record_end, expected, &timestamp_delta,
                                   keyless ? &null_key : NULL);
        if (wrong)
            return malformed(expected, at, wrong);
        if (null_key && append_index(keyless, expected) < 0)
            return NULL;
        min_delta = timestamp_delta < min_delta ? timestamp_delta : min_delta;
        max_delta = timestamp_delta > max_delta ? timestamp_delta : max_delta;
        position = record_end;
    }
    if (position != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left in the records section after %zd records",
                     end - position, count);
        return NULL;
    }
    return Py_BuildValue("(LL)", (long long)min_delta, (long long)max_delta);
}

/* METH_FASTCALL: on small batches, argument parsing costs as much as the walk. */
static PyObject *walk_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 && nargs != 5) {
        PyErr_Format(PyExc_TypeError, "walk_records() takes 4 or 5 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *keyless = nargs == 5 && args[4] != Py_None ? args[4] : NULL;
    if (keyless && !PyList_Check(keyless)) {
        PyErr_SetString(PyExc_TypeError, "walk_records() keyless must be a list or None");
        return NULL;
    }
    Py_ssize_t bounds[3]; /* start, end, count */
    for (int i = 0; i < 3; i++) {
        bounds[i] = PyNumber_AsSsize_t(args[i + 1], PyExc_OverflowError);
        if (bounds[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t start = bounds[0], end = bounds[1], count = bounds[2];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result;
    if (start < 0 || end < start || end > view.len || count < 0) {
        PyErr_Format(PyExc_IndexError, "records section [%zd, %zd) outside a %zd-byte buffer",
                     start, end, view.len);
        result = NULL;
    } else {
        const uint8_t *data = view.buf;
        result = keyless ? walk(data, start, end, count, keyless)
                         : walk(data, start, end, count, NULL);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk_records", (PyCFunction)(void (*)(void))walk_records, METH_FASTCALL,
     "walk_records(buffer, start, end, count, keyless=None) -> (min timestampDelta, max "
     "timestampDelta); appends the indices of records with a null key to `keyless`"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walk", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__walk(void) { return PyModule_Create(&module); }
