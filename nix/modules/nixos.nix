# NixOS: programs.nix-sandbox-mcp installs the server for every user and lets
# unprivileged users create the user namespaces bubblewrap needs.
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
in
{
  _file = ./nixos.nix;

  options.programs.nix-sandbox-mcp = import ./options.nix {
    inherit
      nixSandbox
      config
      lib
      pkgs
      ;
  };

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      {
        environment.systemPackages = [ cfg.finalPackage ];
        # Every run is a new user namespace created by an unprivileged user.
        # A conflicting `false` elsewhere is an error rather than a server
        # that cannot start.
        security.allowUserNamespaces = true;
      }
      # Hardened kernels (e.g. the hardened profile) also gate unprivileged
      # user namespaces behind kernel.unprivileged_userns_clone; the option
      # only exists in NixOS releases that manage that sysctl.
      (lib.optionalAttrs (options.security ? unprivilegedUsernsClone) {
        security.unprivilegedUsernsClone = true;
      })
    ]
  );
}
