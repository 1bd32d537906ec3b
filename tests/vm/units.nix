# The replicas' unit, as the NixOS module makes it (nix/modules/service.nix),
# rendered as a unit file for the VM tier's Debian, which has no Nix: the
# same hardening and directories, run as `user` from `bin`.
{
  bin,
  config,
  user,
}:
let
  # Only the attributes that need no nixpkgs lib are used here.
  service = import ../../nix/modules/service.nix {
    lib = throw "units.nix renders only serviceConfig and environment";
  };
  show =
    v:
    if v == true then
      "true"
    else if v == false then
      "false"
    else
      toString v;
  lines =
    attrs:
    builtins.concatStringsSep "\n" (
      builtins.concatLists (
        map (
          key:
          let
            v = attrs.${key};
          in
          map (x: "${key}=${show x}") (if builtins.isList v then v else [ v ])
        ) (builtins.attrNames attrs)
      )
    );
  environment = service.environment "%i";
in
''
  [Unit]
  Description=nix-sandbox-mcp replica %i (VM tier)

  [Service]
  ${lines (
    service.serviceConfig "%i"
    // {
      User = user;
      Group = user;
      ExecStart = "${bin} --config ${config} serve --http systemd --replica %i";
    }
  )}
  ${builtins.concatStringsSep "\n" (
    map (k: "Environment=${k}=${environment.${k}}") (builtins.attrNames environment)
  )}
''
