/* A static program, run as a Nix closure's interpreter, that shows what
   the sandbox makes of the store: it lists the store (the parent of its
   own store path), tries to write there, in its own path, in the store's
   parent and at the root (all must be read-only), and says whether the
   store directory is a mount of its own (a store view) or a directory
   holding one bind per path. Entries are printed bare; the findings as
   "NAME: 0|1". Used by tests/mcp/test_closures.py, and by the VM tier
   (limits-checks.sh), for which run-tier.sh builds it on the host. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int writable(const char *dir) {
    char path[8192];
    snprintf(path, sizeof path, "%s/new", dir);
    return open(path, O_CREAT | O_WRONLY, 0644) >= 0;
}

int main(int argc, char **argv) {
    char own[4096], store[4096], parent[4096];
    (void)argc;
    strncpy(own, argv[0], sizeof own - 1);
    own[sizeof own - 1] = 0;
    *strrchr(own, '/') = 0; /* .../STORE/HASH-lister/bin */
    *strrchr(own, '/') = 0; /* .../STORE/HASH-lister */
    strcpy(store, own);
    *strrchr(store, '/') = 0;
    strcpy(parent, store);
    *strrchr(parent, '/') = 0;
    DIR *d = opendir(store);
    if (!d) return 2;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) printf("%s\n", e->d_name);
    printf("store writable: %d\n", writable(store));
    printf("path writable: %d\n", writable(own));
    printf("parent writable: %d\n", writable(parent[0] ? parent : "/"));
    printf("root writable: %d\n", writable(""));
    struct stat s, p;
    stat(store, &s);
    stat(parent[0] ? parent : "/", &p);
    printf("store is a mount: %d\n", s.st_dev != p.st_dev);
    return 0;
}
