# frozen_string_literal: true

require "fileutils"

module StackProf
  # stackprof 0.2.27's Rack middleware, profiling with Strobe:
  #
  #   use StackProf::Middleware, enabled: true, mode: :cpu, interval: 1000, save_every: 5
  #
  # Options (as stackprof's): enabled (true/false, or a proc given the Rack
  # env), mode (:cpu), interval (1000), raw (false), path ("tmp/": a
  # directory, ending in "/", gets files named stackprof-MODE-PID-TIME.dump;
  # anything else is the file itself), save_every (write the profile every N
  # profiled requests), save_at_exit, metadata. Settings are kept on the
  # class, as stackprof keeps them. Profiles are written as stackprof's
  # Marshal dumps. Unlike stackprof's, a profiling error (a bad option, a
  # profiler that is already running elsewhere) never fails the request: it
  # is reported once on stderr and the request is served unprofiled.
  class Middleware
    def initialize(app, options = {})
      @app = app
      @options = options
      @num_reqs = options[:save_every] || nil

      Middleware.mode = options[:mode] || :cpu
      Middleware.interval = options[:interval] || 1000
      Middleware.raw = options[:raw] || false
      Middleware.enabled = options[:enabled]
      options[:path] = "tmp/" if options[:path].to_s.empty?
      Middleware.path = options[:path]
      Middleware.metadata = options[:metadata] || {}
      at_exit { Middleware.save } if options[:save_at_exit]
    end

    def call(env)
      started = Middleware.enabled?(env) && Middleware.start_profiling
      @app.call(env)
    ensure
      if started
        StackProf.stop
        if @num_reqs && (@num_reqs -= 1).zero?
          @num_reqs = @options[:save_every]
          Middleware.save
        end
      end
    end

    class << self
      attr_accessor :enabled, :mode, :interval, :raw, :path, :metadata

      def enabled?(env)
        enabled.respond_to?(:call) ? enabled.call(env) : enabled
      end

      # Starts StackProf with the middleware's settings; false (and a line
      # on stderr) when it cannot.
      def start_profiling
        StackProf.start(mode: mode, interval: interval, raw: raw, metadata: metadata)
      rescue StandardError => e
        warn "StackProf::Middleware: not profiling this request: #{e.message}"
        false
      end

      # Writes the profile collected so far; returns its file name, or nil
      # when there is none.
      def save
        results = StackProf.results
        return nil unless results

        dir = path
        if dir == dir.chomp("/")
          filename = File.basename(dir)
          dir = File.dirname(dir)
        else
          filename = "stackprof-#{results[:mode]}-#{Process.pid}-#{Time.now.to_i}.dump"
        end
        FileUtils.mkdir_p(dir)
        Strobe::AtomicFile.write(File.join(dir, filename)) { |io| io.write(Marshal.dump(Strobe.expand(results))) }
        filename
      end
    end
  end
end
