/*
 * symbols.c - names of native code: which loaded object an address is in,
 * and which function.
 *
 * Objects come from dl_iterate_phdr (re-read when an address falls in none
 * known). An object's function symbols are read from its file the first
 * time one of its addresses is looked up: the full symbol table (.symtab)
 * where the file has one, else the table of a separate debug file found by
 * the object's build id (/usr/lib/debug/.build-id/xx/yyyy.debug, where
 * Debian's -dbgsym packages put them), else the dynamic symbols (.dynsym:
 * exported functions only, what dladdr knows). Static functions of a
 * stripped object stay unnamed; native.c then names them by offset.
 *
 * Files are read with pread into buffers (never mapped: a file cut short
 * while it is read must not raise SIGBUS), every offset and size checked
 * against the file's. Only function symbols are kept, their names copied
 * into a pool of their own. Tables are kept for the life of the process
 * (objects are only added: Ruby never unloads an extension), so names handed
 * out stay valid.
 *
 * Thread safety: one mutex around everything; callers are the ring drain
 * (under the profile lock, possibly on the timer thread) and results (GVL
 * held). It never calls strobe_out_of_memory(): an allocation failure
 * leaves an object unnamed instead of unwinding past the mutex.
 * Not signal-safe (it opens files and allocates).
 */
#include "symbols.h"
#include <pthread.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    uintptr_t addr, size;    /* run-time address range */
    uint32_t name;           /* offset into the object's names */
} sym_t;

typedef struct {
    uintptr_t lo, hi;        /* address range of its loaded segments */
    uintptr_t base;          /* load bias: run-time address - link-time address */
    char *path;              /* file it was loaded from */
    const char *short_name;  /* basename of path */
    int read;                /* symbols read (or tried) */
    sym_t *syms;             /* sorted by addr */
    uint32_t nsyms;
    char *names;
} object_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static object_t *objects;
static int objects_len, objects_capa;

/* ---- reading an ELF file ---------------------------------------------------- */

/* An ELF file read with pread (a file cut short while it is read gives a
 * short read, not a SIGBUS as a mapping would), or the vDSO's image in
 * memory. Sections are copied into malloc'd buffers, so every structure is
 * read aligned. */
typedef struct {
    int fd;                  /* -1 for an image in memory */
    const unsigned char *mem;
    size_t size;
    Elf64_Shdr *sh;          /* section headers (malloc) */
    int count;
} elf_t;

static int
elf_read(const elf_t *e, void *buf, size_t len, uint64_t offset)
{
    if (offset > e->size || len > e->size - offset) return -1;
    if (e->fd < 0) {
        memcpy(buf, e->mem + offset, len);
        return 0;
    }
    for (size_t done = 0; done < len;) {
        ssize_t n = pread(e->fd, (char *)buf + done, len - done, (off_t)(offset + done));
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static void
elf_close(elf_t *e)
{
    if (e->fd >= 0) close(e->fd);
    free(e->sh);
    e->fd = -1;
    e->sh = NULL;
}

/* Reads the header and section headers of a 64-bit ELF file. */
static int
elf_load(elf_t *e)
{
    Elf64_Ehdr eh;
    if (elf_read(e, &eh, sizeof(eh), 0) != 0) return -1;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0)
        return -1;
    e->sh = malloc((size_t)eh.e_shnum * sizeof(Elf64_Shdr));
    if (!e->sh || elf_read(e, e->sh, (size_t)eh.e_shnum * sizeof(Elf64_Shdr), eh.e_shoff) != 0) return -1;
    e->count = eh.e_shnum;
    return 0;
}

static int
elf_open(const char *path, elf_t *e)
{
    memset(e, 0, sizeof(*e));
    e->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (e->fd < 0) return -1;
    struct stat st;
    if (fstat(e->fd, &st) != 0 || !S_ISREG(st.st_mode) || elf_load((e->size = (size_t)st.st_size, e)) != 0) {
        elf_close(e);
        return -1;
    }
    return 0;
}

/* A copy of section s's contents (malloc, one NUL byte past its end), or
 * NULL. */
static char *
elf_section(const elf_t *e, const Elf64_Shdr *s)
{
    if (s->sh_type == SHT_NOBITS || s->sh_offset > e->size || s->sh_size > e->size - s->sh_offset) return NULL;
    char *buf = malloc((size_t)s->sh_size + 1);
    if (!buf) return NULL;
    if (elf_read(e, buf, (size_t)s->sh_size, s->sh_offset) != 0) {
        free(buf);
        return NULL;
    }
    buf[s->sh_size] = '\0';
    return buf;
}

/* The first section of the given type, or NULL. */
static const Elf64_Shdr *
find_section(const elf_t *e, uint32_t type)
{
    for (int i = 0; i < e->count; i++)
        if (e->sh[i].sh_type == type) return &e->sh[i];
    return NULL;
}

/* The section named name, or NULL. */
static const Elf64_Shdr *
named_section(const elf_t *e, const char *name, int names_index)
{
    if (names_index <= 0 || names_index >= e->count) return NULL;
    char *names = elf_section(e, &e->sh[names_index]);
    if (!names) return NULL;
    const Elf64_Shdr *found = NULL;
    for (int i = 0; i < e->count && !found; i++)
        if (e->sh[i].sh_name < e->sh[names_index].sh_size && !strcmp(names + e->sh[i].sh_name, name))
            found = &e->sh[i];
    free(names);
    return found;
}

/* The GNU build id as lowercase hex into hex (2 * 64 + 1 bytes), or "". */
static void
build_id(const elf_t *e, char *hex)
{
    hex[0] = '\0';
    for (int i = 0; i < e->count; i++) {
        if (e->sh[i].sh_type != SHT_NOTE) continue;
        char *notes = elf_section(e, &e->sh[i]);
        if (!notes) continue;
        size_t at = 0, size = (size_t)e->sh[i].sh_size;
        while (size - at >= sizeof(Elf64_Nhdr)) {
            Elf64_Nhdr n;
            memcpy(&n, notes + at, sizeof(n));
            size_t name_len = ((size_t)n.n_namesz + 3) & ~(size_t)3, desc_len = ((size_t)n.n_descsz + 3) & ~(size_t)3;
            at += sizeof(n);
            if (size - at < name_len || size - at - name_len < desc_len) break;
            if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 && !memcmp(notes + at, "GNU", 4) && n.n_descsz >= 2 &&
                n.n_descsz <= 64) {
                const unsigned char *id = (const unsigned char *)notes + at + name_len;
                for (uint32_t k = 0; k < n.n_descsz; k++) sprintf(hex + 2 * k, "%02x", id[k]);
                free(notes);
                return;
            }
            at += name_len + desc_len;
        }
        free(notes);
    }
}

static int
by_addr(const void *a, const void *b)
{
    const sym_t *x = a, *y = b;
    if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

static int
is_function(const Elf64_Sym *s, uint64_t names_size)
{
    return ELF64_ST_TYPE(s->st_info) == STT_FUNC && s->st_shndx != SHN_UNDEF && s->st_value && s->st_size &&
           s->st_name < names_size;
}

/* Reads the function symbols of table (a SHT_SYMTAB or SHT_DYNSYM section)
 * into o, their names into a pool of their own. 0 on success. */
static int
read_table(object_t *o, const elf_t *e, const Elf64_Shdr *table)
{
    if (table->sh_entsize != sizeof(Elf64_Sym) || table->sh_link == 0 || table->sh_link >= (uint32_t)e->count)
        return -1;
    const Elf64_Shdr *strs = &e->sh[table->sh_link];
    Elf64_Sym *syms = (Elf64_Sym *)elf_section(e, table);
    char *names = elf_section(e, strs);
    sym_t *out = NULL;
    char *pool = NULL;
    int r = -1;
    size_t n = syms ? (size_t)table->sh_size / sizeof(Elf64_Sym) : 0, kept = 0, pool_size = 0;
    if (names) {
        for (size_t i = 0; i < n; i++) {
            if (!is_function(&syms[i], strs->sh_size)) continue;
            kept++;
            pool_size += strlen(names + syms[i].st_name) + 1; /* the copy ends in a NUL */
        }
    }
    if (kept > 0 && kept <= UINT32_MAX && pool_size <= UINT32_MAX && (out = malloc(kept * sizeof(sym_t))) &&
        (pool = malloc(pool_size))) {
        size_t k = 0, at = 0;
        for (size_t i = 0; i < n; i++) {
            if (!is_function(&syms[i], strs->sh_size)) continue;
            size_t len = strlen(names + syms[i].st_name) + 1;
            memcpy(pool + at, names + syms[i].st_name, len);
            out[k++] = (sym_t){ o->base + (uintptr_t)syms[i].st_value, (uintptr_t)syms[i].st_size, (uint32_t)at };
            at += len;
        }
        qsort(out, kept, sizeof(sym_t), by_addr);
        o->syms = out;
        o->nsyms = (uint32_t)kept;
        o->names = pool;
        out = NULL;
        pool = NULL;
        r = 0;
    }
    free(out);
    free(pool);
    free(syms);
    free(names);
    return r;
}

/* Where a stripped file's symbols may be, and how to tell its debug file:
 * its build id, and its .gnu_debuglink file name with that file's CRC-32. */
typedef struct {
    char build_id[2 * 64 + 1];
    char debuglink[256];
    uint32_t crc;
    int has_crc;
} debug_refs_t;

/* The CRC-32 (gdb's, as in zlib) of a whole file, 0 on success. */
static int
file_crc32(const elf_t *e, uint32_t *out)
{
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    unsigned char buf[65536];
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t at = 0; at < e->size;) {
        size_t len = e->size - at < sizeof(buf) ? e->size - at : sizeof(buf);
        if (elf_read(e, buf, len, at) != 0) return -1;
        for (size_t i = 0; i < len; i++) crc = table[(crc ^ buf[i]) & 0xFF] ^ (crc >> 8);
        at += len;
    }
    *out = crc ^ 0xFFFFFFFFu;
    return 0;
}

/* Whether e is the debug file refs describe: the same build id, or
 * without one, the CRC-32 the link records. A debug file left from another
 * build would name the functions wrongly. */
static int
is_debug_file_of(const elf_t *e, const debug_refs_t *refs)
{
    if (refs->build_id[0]) {
        char id[2 * 64 + 1];
        build_id(e, id);
        return strcmp(id, refs->build_id) == 0;
    }
    uint32_t crc;
    return refs->has_crc && file_crc32(e, &crc) == 0 && crc == refs->crc;
}

static void
read_debug_refs(const elf_t *e, debug_refs_t *refs)
{
    build_id(e, refs->build_id);
    refs->debuglink[0] = '\0';
    refs->has_crc = 0;
    Elf64_Ehdr eh;
    if (elf_read(e, &eh, sizeof(eh), 0) != 0) return;
    const Elf64_Shdr *link = named_section(e, ".gnu_debuglink", eh.e_shstrndx);
    char *content = link ? elf_section(e, link) : NULL;
    if (!content) return;
    /* A file name (NUL-terminated, no directories), padded to 4 bytes, then
     * the file's CRC-32. */
    size_t len = strnlen(content, (size_t)link->sh_size);
    size_t crc_at = (len + 4) & ~(size_t)3;
    if (len > 0 && crc_at + 4 <= link->sh_size && len < sizeof(refs->debuglink) && !memchr(content, '/', len)) {
        memcpy(refs->debuglink, content, len + 1);
        uint32_t crc;
        memcpy(&crc, content + crc_at, 4); /* in the file's byte order: little-endian here */
        refs->crc = crc;
        refs->has_crc = 1;
    }
    free(content);
}

/* Reads the symbols of the file at path: its .symtab, else its .dynsym when
 * with_dynamic. 0 when a table was read. Without a .symtab, refs (if not
 * NULL) receives where debug symbols may be. With debug_of, the file is
 * a debug file, used only if it is debug_of's (is_debug_file_of). */
static int
read_file_symbols(object_t *o, const char *path, int with_dynamic, debug_refs_t *refs,
                  const debug_refs_t *debug_of)
{
    elf_t e;
    if (elf_open(path, &e) != 0) return -1;
    int r = -1;
    if (!debug_of || is_debug_file_of(&e, debug_of)) {
        const Elf64_Shdr *table = find_section(&e, SHT_SYMTAB);
        if (table) r = read_table(o, &e, table);
        if (r != 0 && refs) read_debug_refs(&e, refs);
        if (r != 0 && with_dynamic && (table = find_section(&e, SHT_DYNSYM))) r = read_table(o, &e, table);
    }
    elf_close(&e);
    return r;
}

/* The kernel's vDSO has no file: its image is read where it is mapped. */
static int
read_vdso_symbols(object_t *o)
{
    uintptr_t at = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    if (!at || at != o->lo) return -1;
    /* Its section headers come after what its program headers load, within
     * the pages of its mapping: that is the size to read within. */
    size_t size = 0;
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps) {
        char line[512];
        unsigned long start, end;
        while (fgets(line, sizeof(line), maps))
            if (strstr(line, "[vdso]") && sscanf(line, "%lx-%lx", &start, &end) == 2 && start == at && end > start)
                size = end - start;
        fclose(maps);
    }
    if (size == 0) return -1;
    elf_t e = { -1, (const unsigned char *)at, size, NULL, 0 };
    int r = -1;
    const Elf64_Shdr *table;
    if (elf_load(&e) == 0 && (table = find_section(&e, SHT_DYNSYM))) r = read_table(o, &e, table);
    elf_close(&e);
    return r;
}

/* Symbols from the first of: the file's own .symtab; the debug file its
 * build id names under /usr/lib/debug/.build-id; the file its
 * .gnu_debuglink names, beside it, in .debug/ beside it, or under
 * /usr/lib/debug (where gdb looks); the file's exported .dynsym. A debug
 * file is only used if it is the file's (is_debug_file_of). */
static void
read_symbols(object_t *o)
{
    o->read = 1;
    if (read_vdso_symbols(o) == 0) return;
    debug_refs_t refs = { "", "", 0, 0 };
    if (read_file_symbols(o, o->path, 0, &refs, NULL) == 0) return;
    char debug[4096 + 512];
    if (refs.build_id[0]) {
        snprintf(debug, sizeof(debug), "/usr/lib/debug/.build-id/%.2s/%s.debug", refs.build_id, refs.build_id + 2);
        if (read_file_symbols(o, debug, 0, NULL, &refs) == 0) return;
    }
    const char *slash = strrchr(o->path, '/');
    if (refs.debuglink[0] && slash) {
        int dir = (int)(slash - o->path);
        static const char *const places[] = { "%.*s/%s", "%.*s/.debug/%s", "/usr/lib/debug%.*s/%s" };
        for (size_t i = 0; i < sizeof(places) / sizeof(places[0]); i++) {
            snprintf(debug, sizeof(debug), places[i], dir, o->path, refs.debuglink);
            if (strcmp(debug, o->path) != 0 && read_file_symbols(o, debug, 0, NULL, &refs) == 0) return;
        }
    }
    read_file_symbols(o, o->path, 1, NULL, NULL);
}

/* ---- the objects ------------------------------------------------------------ */

/* What dl_iterate_phdr's callback collects. It runs under glibc's loader
 * lock, so it must not allocate: a handler on another thread, interrupted
 * inside malloc, may be waiting for that lock in libunwind, and the arena
 * it holds would never be released. So it writes into fixed buffers (under
 * the symbols mutex), and objects are added after dl_iterate_phdr returns. */
#define SCAN_OBJECTS 1024
#define SCAN_NAMES (256 * 1024)
typedef struct {
    uintptr_t lo, hi, base;
    uint32_t name;           /* offset into scan.names */
} scanned_t;
static struct {
    scanned_t found[SCAN_OBJECTS];
    int len;
    char names[SCAN_NAMES];
    size_t names_len;
} scan;

static int
scan_object(struct dl_phdr_info *info, size_t size, void *unused)
{
    (void)size; (void)unused;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (start < lo) lo = start;
        if (start + ph->p_memsz > hi) hi = start + ph->p_memsz;
    }
    if (lo >= hi) return 0;
    if (scan.len == SCAN_OBJECTS) return 1;
    char *name = scan.names + scan.names_len;
    size_t room = SCAN_NAMES - scan.names_len;
    if (room < 2) return 1;
    size_t len;
    if (info->dlpi_name && info->dlpi_name[0]) {
        len = strlen(info->dlpi_name);
        if (len >= room) return 1;
        memcpy(name, info->dlpi_name, len + 1);
    } else { /* the main program */
        ssize_t n = readlink("/proc/self/exe", name, room - 1);
        if (n <= 0 || (size_t)n >= room - 1) return 0;
        name[n] = '\0';
        len = (size_t)n;
    }
    scan.found[scan.len++] = (scanned_t){ lo, hi, info->dlpi_addr, (uint32_t)scan.names_len };
    scan.names_len += len + 1;
    return 0;
}

static void
add_loaded_objects(void)
{
    scan.len = 0;
    scan.names_len = 0;
    dl_iterate_phdr(scan_object, NULL);
    for (int k = 0; k < scan.len; k++) {
        int known = 0;
        for (int i = 0; i < objects_len && !known; i++)
            known = objects[i].lo == scan.found[k].lo && objects[i].base == scan.found[k].base;
        if (known) continue;
        if (objects_len == objects_capa) {
            int capa = objects_capa ? objects_capa * 2 : 64;
            object_t *grown = realloc(objects, (size_t)capa * sizeof(object_t));
            if (!grown) return;
            objects = grown;
            objects_capa = capa;
        }
        char *copy = strdup(scan.names + scan.found[k].name);
        if (!copy) return;
        const char *slash = strrchr(copy, '/');
        objects[objects_len++] = (object_t){ scan.found[k].lo, scan.found[k].hi, scan.found[k].base, copy,
                                             slash ? slash + 1 : copy, 0, NULL, 0, NULL };
    }
}

static object_t *
object_at(uintptr_t addr)
{
    static int last;
    for (int pass = 0; pass < 2; pass++) {
        if (last < objects_len && objects[last].lo <= addr && addr < objects[last].hi) return &objects[last];
        for (int i = 0; i < objects_len; i++)
            if (objects[i].lo <= addr && addr < objects[i].hi) return &objects[last = i];
        if (pass == 0) add_loaded_objects(); /* loaded since */
    }
    return NULL;
}

int
strobe_symbols_find(uintptr_t addr, strobe_symbol_t *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&lock);
    object_t *o = object_at(addr);
    if (o) {
        if (!o->read) read_symbols(o);
        out->object = (int)(o - objects);
        out->path = o->path;
        out->object_name = o->short_name;
        out->base = o->base;
        /* The last symbol starting at or before addr that contains it. */
        uint32_t lo = 0, hi = o->nsyms;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (o->syms[mid].addr <= addr) lo = mid + 1;
            else hi = mid;
        }
        for (uint32_t i = lo, tries = 0; i-- > 0 && tries++ < 64;) { /* nested symbols are rare */
            if (addr - o->syms[i].addr < o->syms[i].size) {
                out->start = o->syms[i].addr;
                out->name = o->names + o->syms[i].name;
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return o != NULL;
}
