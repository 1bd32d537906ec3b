# NixOS: programs.nix-sandbox-mcp installs the server for every user. Every
# sandbox is a new user namespace created by an unprivileged user, which a
# hardened system may forbid: the module says so rather than overriding it.
nixSandbox:
{
  config,
  lib,
  options,
  pkgs,
  ...
}:
let
  cfg = config.programs.nix-sandbox-mcp;
  shared = import ./options.nix {
    inherit
      nixSandbox
      config
      lib
      pkgs
      ;
  };
  # Only NixOS releases that manage the kernel.unprivileged_userns_clone
  # switch (which linux_hardened and the hardened profile turn off) have it.
  hasUsernsClone = options.security ? unprivilegedUsernsClone;
in
{
  _file = ./nixos.nix;

  options.programs.nix-sandbox-mcp = shared.options;

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      {
        environment.systemPackages = [ cfg.finalPackage ];
        assertions = shared.assertions ++ [
          {
            assertion = config.security.allowUserNamespaces;
            message = "programs.nix-sandbox-mcp: security.allowUserNamespaces = false sets user.max_user_namespaces to 0, and every sandbox is a new user namespace, so no code could run; set security.allowUserNamespaces = true, or disable programs.nix-sandbox-mcp.";
          }
        ];
      }
      (lib.optionalAttrs hasUsernsClone {
        # Weaker than lib.mkDefault, so that a profile's own default (the
        # hardened profile sets this one with mkDefault) wins instead of
        # conflicting with it, and the warning below says what that costs.
        security.unprivilegedUsernsClone = lib.mkOverride 1100 true;
        warnings = lib.optional (!config.security.unprivilegedUsernsClone) "programs.nix-sandbox-mcp: security.unprivilegedUsernsClone is false, so on a kernel with the kernel.unprivileged_userns_clone switch (linux_hardened, which the hardened profile uses) a user other than root cannot create the user namespace every sandbox needs, and each run fails with \"No permissions to create new namespace\"; set security.unprivilegedUsernsClone = true to run sandboxes as a normal user.";
      })
    ]
  );
}
