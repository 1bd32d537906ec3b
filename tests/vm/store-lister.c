/* Lists the store its own store path is in (every entry but . and ..), for
   the VM tier's check that a sandbox sees exactly its Nix closure. Built
   static on the host by run-tier.sh. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    char store[4096];
    (void)argc;
    strncpy(store, argv[0], sizeof store - 1);
    store[sizeof store - 1] = 0;
    for (int i = 0; i < 3; i++) *strrchr(store, '/') = 0;
    DIR *d = opendir(store);
    if (!d) return 2;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) printf("%s\n", e->d_name);
    return 0;
}
