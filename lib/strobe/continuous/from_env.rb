# frozen_string_literal: true

require_relative "../redact"

module Strobe
  class Continuous
    # Continuous profiling set up by the environment, for autorun
    # (RUBYOPT=-rstrobe/autorun):
    #
    #   STROBE_CONTINUOUS_URL   the Pyroscope server: push windows there
    #   STROBE_SERVICE_NAME     the service (default: the program's name)
    #   STROBE_LABELS           k=v,k2=v2: labels of every window
    #   STROBE_UPLOAD_EVERY     seconds per window (default 15)
    #   STROBE_OVERHEAD_TARGET  share of one CPU (default 0.01; 0: none)
    #   STROBE_BASIC_AUTH       user:password, or
    #   STROBE_BEARER_TOKEN     a token; STROBE_TENANT_ID: X-Scope-OrgID
    #   STROBE_PPROF_LISTEN     host:port: serve /debug/pprof/profile there
    #                           instead (Alloy, Parca); STROBE_PPROF_TOKEN
    #                           then required of every request (and of any
    #                           address but loopback, unless
    #                           STROBE_PPROF_INSECURE=1)
    #   STROBE_MODE, STROBE_INTERVAL as for autorun
    class FromEnv
      def initialize(env)
        @env = env
      end


      # Starts what the environment asks for; returns a line saying what
      # runs. ArgumentError names a setting that cannot be used.
      def start(err)
        url = present("STROBE_CONTINUOUS_URL")
        listen = present("STROBE_PPROF_LISTEN")
        if url && listen
          raise ArgumentError, "STROBE_CONTINUOUS_URL and STROBE_PPROF_LISTEN are both set: Strobe samples one " \
                               "profile at a time, so pushing leaves nothing for pulls; set one"
        end
        return start_listening(listen, err) if listen

        session = Continuous.start(**push_options, err: err)
        raise Busy, "continuous profiling runs already" unless session

        "profiling continuously to #{Redact.url(session.config.url)} as #{session.config.service_name}"
      end

      private

      def start_listening(address, err)
        server = Continuous.listen(address, token: present("STROBE_PPROF_TOKEN"), insecure: insecure,
                                            mode: mode || :cpu, interval: interval, err: err)
        "serving pprof at http://#{server.host}:#{server.port}/debug/pprof/profile?seconds=N"
      end

      # STROBE_PPROF_INSECURE: 1 to serve any address without a token.
      def insecure
        case (value = present("STROBE_PPROF_INSECURE"))
        when nil, "0" then false
        when "1" then true
        else raise ArgumentError, "STROBE_PPROF_INSECURE must be 1 or 0, got #{value.inspect}"
        end
      end

      def push_options
        opts = { url: present("STROBE_CONTINUOUS_URL"), service_name: present("STROBE_SERVICE_NAME") || program_name,
                 labels: labels, mode: mode, interval: interval }
        opts[:upload_every] = number("STROBE_UPLOAD_EVERY") if present("STROBE_UPLOAD_EVERY")
        if present("STROBE_OVERHEAD_TARGET")
          target = number("STROBE_OVERHEAD_TARGET")
          opts[:overhead_target] = target.zero? ? false : target
        end
        opts[:bearer_token] = present("STROBE_BEARER_TOKEN") if present("STROBE_BEARER_TOKEN")
        opts[:tenant_id] = present("STROBE_TENANT_ID") if present("STROBE_TENANT_ID")
        if (basic = present("STROBE_BASIC_AUTH"))
          user, password = basic.split(":", 2)
          raise ArgumentError, "STROBE_BASIC_AUTH must be user:password" unless password

          opts[:basic_auth] = [user, password]
        end
        opts.compact
      end

      # The program's file name, in the characters a service name may have.
      def program_name
        name = File.basename($PROGRAM_NAME.to_s, ".rb").gsub(%r{[^A-Za-z0-9_.\-/]}, "_")
        name.empty? ? "ruby" : name
      end

      def labels
        (present("STROBE_LABELS") || "").split(",").to_h do |pair|
          name, value = pair.split("=", 2)
          raise ArgumentError, "STROBE_LABELS must be k=v,k2=v2, got #{pair.inspect}" unless value

          [name.strip, value.strip]
        end
      end

      def mode
        present("STROBE_MODE")&.to_sym
      end

      def interval
        value = present("STROBE_INTERVAL") or return nil
        Integer(value, 10)
      rescue ArgumentError
        raise ArgumentError, "STROBE_INTERVAL must be an integer, got #{value.inspect}"
      end

      def number(name)
        Float(present(name))
      rescue ArgumentError
        raise ArgumentError, "#{name} must be a number, got #{present(name).inspect}"
      end

      def present(name)
        value = @env[name]&.strip
        value unless value.nil? || value.empty?
      end
    end
  end
end
