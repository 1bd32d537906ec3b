{
  description = "nix-sandbox-mcp: an MCP server that runs code from AI agents in bubblewrap sandboxes built by Nix";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems f;

      nixSandbox = import ./nix { inherit self nixpkgs; };

      # Per system: this flake's nixpkgs, the daemon and the presets built with it.
      builds = forAllSystems (
        system:
        let
          pkgs = nixSandbox.pkgsFor system;
          daemon = nixSandbox.daemonFor system;
        in
        {
          inherit pkgs daemon;
          presets = nixSandbox.presetsFor { inherit pkgs daemon; };
          server = nixSandbox.defaultServer { inherit pkgs daemon; };
        }
      );
    in
    {
      lib = {
        inherit (nixSandbox)
          mkSandbox
          mkServer
          projectSandbox
          flakeSandbox
          captureShellEnvironment
          ;
      };

      packages = forAllSystems (
        system:
        let
          inherit (builds.${system}) presets server;
        in
        {
          nix-sandbox-mcp = server;
          default = server;
        }
        // nixpkgs.lib.mapAttrs' (name: nixpkgs.lib.nameValuePair "sandbox-${name}") presets
      );

      apps = forAllSystems (
        system:
        let
          inherit (builds.${system}) presets server;
          serverApp = {
            type = "app";
            program = nixpkgs.lib.getExe server;
            meta.description = "nix-sandbox-mcp; `--stdio` serves MCP";
          };
        in
        {
          nix-sandbox-mcp = serverApp;
          default = serverApp;
        }
        // nixpkgs.lib.mapAttrs' (
          name: sandbox:
          nixpkgs.lib.nameValuePair "sandbox-${name}" {
            type = "app";
            program = "${sandbox}/bin/run";
            meta.description = "Run code once in the ${name} sandbox: CODE, -f FILE or - for stdin";
          }
        ) presets
      );

      # pkgs.nix-sandbox-mcp built with the consumer's nixpkgs, whose rustc
      # must be 1.85 or later (nix/daemon.nix checks it).
      overlays.default = final: _prev: {
        nix-sandbox-mcp = nixSandbox.defaultServer {
          pkgs = final;
          daemon = final.callPackage ./nix/daemon.nix { };
        };
      };

      nixosModules.default = import ./nix/modules/nixos.nix nixSandbox;
      homeManagerModules.default = import ./nix/modules/home-manager.nix nixSandbox;

      checks = forAllSystems (
        system:
        let
          inherit (builds.${system}) pkgs daemon server;
        in
        {
          package = server;
          # The unit tests only: the integration tests start real sandboxes,
          # which a Nix build cannot; the VM test covers the server instead.
          cargo-unit-tests = daemon.overrideAttrs (_: {
            doCheck = true;
            cargoTestFlags = [ "--lib" ];
          });
          eval-tests = import ./nix/tests/eval-check.nix {
            inherit pkgs;
            name = "eval-tests";
            inherit (import ./nix/tests/eval.nix) summary;
          };
          module-tests = import ./nix/tests/eval-check.nix {
            inherit pkgs;
            name = "module-tests";
            inherit (import ./nix/tests/modules.nix { nixpkgsLib = "${nixpkgs}/lib"; }) summary;
          };
          vm = import ./nix/tests/vm.nix {
            inherit pkgs;
            nixosModule = self.nixosModules.default;
          };
        }
      );

      # `nix flake check` less the NixOS VM test, which needs KVM:
      #   nix build .#checks-without-vm
      legacyPackages = forAllSystems (system: {
        checks-without-vm = builds.${system}.pkgs.linkFarm "nix-sandbox-mcp-checks-without-vm" (
          nixpkgs.lib.mapAttrsToList (name: path: { inherit name path; }) (
            builtins.removeAttrs self.checks.${system} [ "vm" ]
          )
        );
      });

      devShells = forAllSystems (
        system:
        let
          inherit (builds.${system}) pkgs;
        in
        {
          default = pkgs.mkShell {
            packages = with pkgs; [
              cargo
              rustc
              clippy
              rustfmt
              rust-analyzer
              bubblewrap
              python3
              nodejs
              jq
              nixfmt
            ];
            RUST_SRC_PATH = "${pkgs.rustPlatform.rustLibSrc}";
          };
        }
      );

      formatter = forAllSystems (
        system:
        let
          inherit (builds.${system}) pkgs;
        in
        pkgs.treefmt.withConfig {
          runtimeInputs = [ pkgs.nixfmt ];
          settings = {
            tree-root-file = "flake.nix";
            on-unmatched = "info";
            formatter.nixfmt = {
              command = "nixfmt";
              includes = [ "*.nix" ];
            };
          };
        }
      );
    };
}
