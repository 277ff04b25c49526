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
 * Tables are kept for the life of the process (objects are only added:
 * Ruby never unloads an extension), so names handed out stay valid.
 *
 * Thread safety: one mutex around everything; callers are the ring drain
 * (under the profile lock, possibly on the timer thread) and results (GVL
 * held). It never calls strobe_out_of_memory(): an allocation failure
 * leaves an object unnamed instead of unwinding past the mutex.
 * Not signal-safe (it opens files and allocates).
 */
#include "strobe.h"
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

typedef struct {
    const unsigned char *data;
    size_t size;
} image_t;

static int
map_file(const char *path, image_t *img)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= (off_t)sizeof(Elf64_Ehdr))
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -1;
    img->data = p;
    img->size = (size_t)st.st_size;
    return 0;
}

/* The section headers of a 64-bit ELF image, or NULL when it is not one
 * (or they lie outside the file). */
static const Elf64_Shdr *
section_headers(const image_t *img, int *count)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img->data;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return NULL;
    if (eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shnum == 0) return NULL;
    if (eh->e_shoff > img->size || (img->size - eh->e_shoff) / sizeof(Elf64_Shdr) < eh->e_shnum) return NULL;
    *count = eh->e_shnum;
    return (const Elf64_Shdr *)(img->data + eh->e_shoff);
}

static int
section_in_file(const image_t *img, const Elf64_Shdr *sh)
{
    return sh->sh_type != SHT_NOBITS && sh->sh_offset <= img->size && sh->sh_size <= img->size - sh->sh_offset;
}

/* The section of the given type (the first), or NULL. */
static const Elf64_Shdr *
find_section(const image_t *img, const Elf64_Shdr *sh, int count, uint32_t type)
{
    for (int i = 0; i < count; i++)
        if (sh[i].sh_type == type && section_in_file(img, &sh[i])) return &sh[i];
    return NULL;
}

/* The GNU build id as lowercase hex into hex (at least 2 * 64 + 1 bytes);
 * 0 when the image has none. */
static int
build_id(const image_t *img, const Elf64_Shdr *sh, int count, char *hex)
{
    for (int i = 0; i < count; i++) {
        if (sh[i].sh_type != SHT_NOTE || !section_in_file(img, &sh[i])) continue;
        const unsigned char *p = img->data + sh[i].sh_offset, *end = p + sh[i].sh_size;
        while ((size_t)(end - p) >= sizeof(Elf64_Nhdr)) {
            const Elf64_Nhdr *n = (const Elf64_Nhdr *)p;
            size_t name_len = (n->n_namesz + 3) & ~(size_t)3, desc_len = (n->n_descsz + 3) & ~(size_t)3;
            p += sizeof(Elf64_Nhdr);
            if ((size_t)(end - p) < name_len || (size_t)(end - p - name_len) < desc_len) break;
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && !memcmp(p, "GNU", 4) &&
                n->n_descsz >= 2 && n->n_descsz <= 64) {
                const unsigned char *id = p + name_len;
                for (uint32_t k = 0; k < n->n_descsz; k++) sprintf(hex + 2 * k, "%02x", id[k]);
                return 1;
            }
            p += name_len + desc_len;
        }
    }
    return 0;
}

static int
by_addr(const void *a, const void *b)
{
    const sym_t *x = a, *y = b;
    if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

/* Reads the function symbols of table (a SHT_SYMTAB or SHT_DYNSYM section)
 * into o. 0 on success. */
static int
read_table(object_t *o, const image_t *img, const Elf64_Shdr *sh, int count, const Elf64_Shdr *table)
{
    if (table->sh_entsize != sizeof(Elf64_Sym) || table->sh_link >= (uint32_t)count) return -1;
    const Elf64_Shdr *strs = &sh[table->sh_link];
    if (!section_in_file(img, strs) || strs->sh_size == 0) return -1;
    const Elf64_Sym *syms = (const Elf64_Sym *)(img->data + table->sh_offset);
    size_t n = table->sh_size / sizeof(Elf64_Sym);
    const char *names = (const char *)(img->data + strs->sh_offset);

    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (ELF64_ST_TYPE(syms[i].st_info) == STT_FUNC && syms[i].st_shndx != SHN_UNDEF &&
            syms[i].st_value && syms[i].st_size && syms[i].st_name < strs->sh_size)
            kept++;
    if (kept == 0 || kept > UINT32_MAX) return -1;
    sym_t *out = malloc(kept * sizeof(sym_t));
    char *copy = malloc(strs->sh_size + 1);
    if (!out || !copy) { free(out); free(copy); return -1; }
    memcpy(copy, names, strs->sh_size);
    copy[strs->sh_size] = '\0'; /* a last name left unterminated ends here */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const Elf64_Sym *s = &syms[i];
        if (ELF64_ST_TYPE(s->st_info) == STT_FUNC && s->st_shndx != SHN_UNDEF && s->st_value && s->st_size &&
            s->st_name < strs->sh_size)
            out[k++] = (sym_t){ o->base + (uintptr_t)s->st_value, (uintptr_t)s->st_size, s->st_name };
    }
    qsort(out, kept, sizeof(sym_t), by_addr);
    o->syms = out;
    o->nsyms = (uint32_t)kept;
    o->names = copy;
    return 0;
}

/* Where a stripped file's symbols may be: its build id and its
 * .gnu_debuglink file name. */
typedef struct {
    char build_id[2 * 64 + 1];
    char debuglink[256];
} debug_refs_t;

static void
read_debug_refs(const image_t *img, const Elf64_Shdr *sh, int count, debug_refs_t *refs)
{
    if (!build_id(img, sh, count, refs->build_id)) refs->build_id[0] = '\0';
    refs->debuglink[0] = '\0';
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img->data;
    if (eh->e_shstrndx >= count || !section_in_file(img, &sh[eh->e_shstrndx])) return;
    const Elf64_Shdr *names = &sh[eh->e_shstrndx];
    for (int i = 0; i < count; i++) {
        if (sh[i].sh_name >= names->sh_size || !section_in_file(img, &sh[i])) continue;
        const char *name = (const char *)img->data + names->sh_offset + sh[i].sh_name;
        size_t room = names->sh_size - sh[i].sh_name;
        if (strnlen(name, room) == room || strcmp(name, ".gnu_debuglink") != 0) continue;
        /* A file name (NUL-terminated, no directories), then a CRC. */
        const char *link = (const char *)img->data + sh[i].sh_offset;
        size_t len = strnlen(link, sh[i].sh_size);
        if (len > 0 && len < sh[i].sh_size && len < sizeof(refs->debuglink) && !memchr(link, '/', len))
            memcpy(refs->debuglink, link, len + 1);
        return;
    }
}

/* Reads the symbols of o's file from path: .symtab, else .dynsym (when
 * with_dynamic). 0 when a table was read. Without a .symtab, refs (if not
 * NULL) receives where debug symbols may be. */
static int
read_file_symbols(object_t *o, const char *path, int with_dynamic, debug_refs_t *refs)
{
    image_t img;
    if (map_file(path, &img) != 0) return -1;
    int count = 0, r = -1;
    const Elf64_Shdr *sh = section_headers(&img, &count);
    if (sh) {
        const Elf64_Shdr *table = find_section(&img, sh, count, SHT_SYMTAB);
        if (table) r = read_table(o, &img, sh, count, table);
        if (r != 0 && refs) read_debug_refs(&img, sh, count, refs);
        if (r != 0 && with_dynamic && (table = find_section(&img, sh, count, SHT_DYNSYM)))
            r = read_table(o, &img, sh, count, table);
    }
    munmap((void *)img.data, img.size);
    return r;
}

/* The kernel's vDSO has no file: its image is read where it is mapped. */
static int
read_vdso_symbols(object_t *o)
{
    uintptr_t at = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    if (!at || at != o->lo) return -1;
    image_t img = { (const unsigned char *)at, o->hi - o->lo };
    int count = 0;
    const Elf64_Shdr *sh = section_headers(&img, &count);
    const Elf64_Shdr *table = sh ? find_section(&img, sh, count, SHT_DYNSYM) : NULL;
    return table ? read_table(o, &img, sh, count, table) : -1;
}

/* Symbols from the first of: the file's own .symtab; the debug file its
 * build id names under /usr/lib/debug/.build-id; the file its
 * .gnu_debuglink names, beside it, in .debug/ beside it, or under
 * /usr/lib/debug (where gdb looks); the file's exported .dynsym. */
static void
read_symbols(object_t *o)
{
    o->read = 1;
    if (read_vdso_symbols(o) == 0) return;
    debug_refs_t refs = { "", "" };
    if (read_file_symbols(o, o->path, 0, &refs) == 0) return;
    char debug[4096 + 512];
    if (refs.build_id[0]) {
        snprintf(debug, sizeof(debug), "/usr/lib/debug/.build-id/%.2s/%s.debug", refs.build_id, refs.build_id + 2);
        if (read_file_symbols(o, debug, 0, NULL) == 0) return;
    }
    const char *slash = strrchr(o->path, '/');
    if (refs.debuglink[0] && slash) {
        int dir = (int)(slash - o->path);
        static const char *const places[] = { "%.*s/%s", "%.*s/.debug/%s", "/usr/lib/debug%.*s/%s" };
        for (size_t i = 0; i < sizeof(places) / sizeof(places[0]); i++) {
            snprintf(debug, sizeof(debug), places[i], dir, o->path, refs.debuglink);
            if (strcmp(debug, o->path) != 0 && read_file_symbols(o, debug, 0, NULL) == 0) return;
        }
    }
    read_file_symbols(o, o->path, 1, NULL);
}

/* ---- the objects ------------------------------------------------------------ */

static int
add_object(struct dl_phdr_info *info, size_t size, void *unused)
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
    for (int i = 0; i < objects_len; i++)
        if (objects[i].lo == lo && objects[i].base == info->dlpi_addr) return 0; /* known */

    char exe[4096];
    const char *path = info->dlpi_name;
    if (!path || !path[0]) { /* the main program */
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0) return 0;
        exe[n] = '\0';
        path = exe;
    }
    if (objects_len == objects_capa) {
        int capa = objects_capa ? objects_capa * 2 : 64;
        object_t *grown = realloc(objects, (size_t)capa * sizeof(object_t));
        if (!grown) return 1;
        objects = grown;
        objects_capa = capa;
    }
    char *copy = strdup(path);
    if (!copy) return 1;
    const char *slash = strrchr(copy, '/');
    objects[objects_len++] = (object_t){ lo, hi, info->dlpi_addr, copy, slash ? slash + 1 : copy, 0, NULL, 0, NULL };
    return 0;
}

static object_t *
object_at(uintptr_t addr)
{
    static int last;
    for (int pass = 0; pass < 2; pass++) {
        if (last < objects_len && objects[last].lo <= addr && addr < objects[last].hi) return &objects[last];
        for (int i = 0; i < objects_len; i++)
            if (objects[i].lo <= addr && addr < objects[i].hi) return &objects[last = i];
        if (pass == 0) dl_iterate_phdr(add_object, NULL); /* loaded since */
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

int
strobe_symbols_object_of(uintptr_t addr)
{
    pthread_mutex_lock(&lock);
    object_t *o = object_at(addr);
    int index = o ? (int)(o - objects) : -1;
    pthread_mutex_unlock(&lock);
    return index;
}
