# frozen_string_literal: true

# `strobe serve`: its options, and the command run in its place with every
# Ruby process it starts serving its profile.

module Strobe
  class CLI
    # `strobe serve [options] [--] COMMAND...` (included into CLI).
    module ServeCommand
      DEFAULT_PORT = 5150

      # Runs COMMAND in place of this process (exec), with every Ruby process
      # it starts set up by RUBYOPT and STROBE_SERVE to profile itself and
      # serve its profile (see Strobe::Serve); the first to bind the port
      # serves. Returns only when COMMAND cannot be run.
      def serve_command(args)
        settings = { mode: "wall", interval: nil, port: DEFAULT_PORT }
        serve_parser(settings).order!(args)
        raise UsageError, "serve: no COMMAND given (see strobe serve --help)" if args.empty?
        unless MODES.include?(settings[:mode])
          raise UsageError, "serve: invalid mode: #{settings[:mode]} (use one of #{MODES.join(', ')})"
        end
        if settings[:mode] == "trace"
          raise UsageError, "serve: mode trace cannot be served (the Firefox Profiler shows samples: use one of " \
                            "#{(MODES - ['trace']).join(', ')})"
        end

        throw :exit, 1 if settings[:native] && !require_engine # Options checks that it has libunwind
        begin
          # What the program's autorun checks (STROBE_IGNORE_GC from the environment too).
          Options.new(mode: settings[:mode], interval: settings[:interval], native: settings[:native], raw: true,
                      ignore_gc: Options.env_flag("STROBE_IGNORE_GC", ENV["STROBE_IGNORE_GC"]))
        rescue ArgumentError => e
          raise UsageError, "serve: #{e.message}"
        end
        env = ruby_env.merge("STROBE_MODE" => settings[:mode], "STROBE_INTERVAL" => settings[:interval]&.to_s,
                             "STROBE_NATIVE" => settings[:native] ? "1" : "0",
                             "STROBE_SERVE" => settings[:port].to_s, "STROBE_SIGNAL" => nil, "STROBE_OUT" => nil,
                             "STROBE_OUT_DIR" => nil)
        Process.exec(env, *args)
      rescue SystemCallError => e
        error "cannot run #{args.first}: #{system_reason(e)}"
      end

      private

      def serve_parser(settings)
        OptionParser.new do |parser|
          parser.banner = "Usage: strobe serve [options] [--] COMMAND [ARGS...]"
          parser.separator ""
          parser.separator "Runs COMMAND (e.g. `ruby app.rb`) profiled by Strobe, and serves the profile collected so"
          parser.separator "far on http://127.0.0.1:PORT/TOKEN/profile.json for the Firefox Profiler, and in Strobe's"
          parser.separator "own format on http://127.0.0.1:PORT/TOKEN/strobe.json for `strobe report URL`; the links"
          parser.separator "are printed on stderr. TOKEN is random: only who has a link can read the profile, and"
          parser.separator "only the Firefox Profiler's page (https://profiler.firefox.com) may read it from a browser."
          parser.separator "When COMMAND's Ruby program ends, its profile stays served until Ctrl-C (or TERM); a"
          parser.separator "program ended by TERM is not served any longer. Mode trace is not served."
          parser.separator ""
          parser.separator "Options:"
          sampling_options(parser, settings)
          parser.on("-p", "--port N", Integer, "Port on 127.0.0.1 (default: #{DEFAULT_PORT}; 0: any free port)") do |n|
            raise OptionParser::InvalidArgument, "#{n} (must be from 0 to 65535)" unless n.between?(0, 65_535)

            settings[:port] = n
          end
          common_options(parser)
        end
      end
    end
  end
end
