# frozen_string_literal: true

require "stringio"
require_relative "../strobe"
require_relative "fork_hook"
require_relative "continuous/errors"
require_relative "continuous/config"
require_relative "continuous/governor"
require_relative "continuous/uploader"
require_relative "continuous/pyroscope"

module Strobe
  # Continuous profiling for fleets: the process is sampled all along, and
  # every upload_every seconds the window's samples go to Grafana Pyroscope
  # as gzipped pprof, labelled with the service, host, pid, Ruby and
  # Strobe versions and the user's labels (each sample with its thread, and
  # under Strobe::Continuous::Endpoints its request's endpoint).
  #
  #   Strobe::Continuous.start(url: "http://pyroscope:4040", service_name: "shop",
  #                            labels: { region: "eu" })
  #
  # Options (Config checks them): url:, service_name: (required), labels:,
  # mode: (:cpu, the default; :wall, :object), interval: (the fastest it
  # samples; 10 ms), upload_every: (seconds, 15), overhead_target: (a
  # share of one CPU, 0.01; false: sample at interval: whatever it costs),
  # basic_auth: [user, password] or bearer_token:, tenant_id: (sent as
  # X-Scope-OrgID), ca_file:, timeout: (seconds per upload, 10),
  # flush_timeout: (seconds at exit, 5), spy_name: ("strobe").
  #
  # It never hurts the program: windows are cut and encoded on a thread of
  # Strobe's own and uploaded on another (Uploader: bounded, dropped and
  # counted when the store is slow or down, retried with backoff); nothing
  # it raises reaches the program's threads (problems are one line on
  # stderr); a forked child (a Puma worker) or a daemon starts its own;
  # stop and stats are safe in a trap handler at any point; at exit the
  # last window is sent within flush_timeout:. The Governor holds Strobe's
  # measured cost (signal handler, timer thread, encoding, upload) near
  # overhead_target: by lengthening or shortening the interval; the rate in
  # force is each window's pprof period and its sample_rate label.
  #
  # Strobe samples one profile at a time: while this runs, Strobe.start,
  # the middleware and the pull listener find the profiler busy.
  class Continuous
    # The slowest the governor samples (microseconds; allocations in
    # :object mode).
    SLOWEST = { cpu: 1_000_000, wall: 1_000_000, object: 1 << 20 }.freeze

    # Loaded when first named: the middleware, and the pull listener.
    autoload :Endpoints, File.expand_path("continuous/endpoints", __dir__)
    autoload :PullServer, File.expand_path("continuous/pull", __dir__)
    autoload :PullProfiler, File.expand_path("continuous/pull_profiler", __dir__)

    @lock = Mutex.new
    @current = @starter = @stopper = nil
    @hooked = false

    # A forked child's session starts this long after the fork (seconds):
    # a child that execs or exits at once (fork { exec ... }) costs nothing.
    CHILD_DELAY = 1.0

    # How long stop waits for the thread that stops the session beyond its
    # flush_timeout: (the window and upload threads' last joins, 1 s each).
    STOP_GRACE = 5.0

    TRAP_PROBE = Mutex.new

    class << self
      # Starts continuous profiling; returns the Continuous, or false when
      # one runs already. ArgumentError names a bad option; Busy says why
      # the profiler could not start (another profile is running). From a
      # trap handler (where Ruby takes no lock) the start is made on a
      # thread of its own, waited for at most STOP_GRACE seconds (then nil:
      # it goes on); a trap that landed inside this thread's own start or
      # stop gets false at once.
      def start(**options)
        config = Config.new(options)
        return start_from_trap(config) if trap_context?

        start_session(config)
      end

      # Whether the caller runs in a trap handler: Mutex#lock raises
      # ThreadError there (nobody holds TRAP_PROBE for longer than a probe).
      private def trap_context?
        TRAP_PROBE.synchronize { false }
      rescue ThreadError
        true
      end

      # start's work on a thread the trap handler can wait for. An error
      # is raised in the handler, or said in a line once it stopped waiting.
      private def start_from_trap(config)
        return false if @lock.owned?

        waiting = true
        starter = Thread.new do
          Native.exclude_current_thread
          start_session(config)
        rescue StandardError => e
          waiting ? e : warn_line(config.err, "not profiling: #{e.message}")
        end
        starter.name = "strobe continuous start"
        result = starter.join(STOP_GRACE)&.value
        waiting = false
        raise result if result.is_a?(Exception)

        result
      end

      private def start_session(config)
        current # (a session to take over after a fork that bypassed the hook)
        @lock.synchronize do
          return false if @current&.running? || @starter&.alive?

          install_hooks
          launch(new(config))
        end
      end

      # Stops it: the last window is cut and sent (within flush_timeout:
      # seconds). Returns its stats, or nil when none was running. The work
      # is done on a thread of its own, which calls made meanwhile share,
      # so it works from a trap handler at any point of the program. Never
      # waits on what the caller may hold: from a trap handler that landed
      # inside start (which holds the lock the stop needs), it returns nil
      # at once, and the session stops as soon as start returns. Otherwise
      # it waits at most flush_timeout: + STOP_GRACE seconds (then nil: the
      # stop goes on).
      def stop
        longest = (@current&.config&.flush_timeout || 0) + STOP_GRACE
        stopper = @stopper if @stopper&.alive?
        stopper ||= @stopper = Thread.new { stop_session }.tap { |thread| thread.name = "strobe continuous stop" }
        return nil if @lock.owned?

        stopper.join(longest)&.value
      end

      def running?
        current&.running? || false
      end

      # The counts of the running session (see #stats); nil when none runs.
      # A snapshot, read without a lock (a trap handler may ask).
      def stats
        session = @current
        session.stats if session&.pid == Process.pid
      end

      # Serves Go's pprof endpoints (/debug/pprof/profile?seconds=N) at
      # address ("127.0.0.1:6060"; ":6060" for every interface) for Grafana
      # Alloy and Parca to scrape; see Continuous::PullServer. Any address
      # but loopback needs token: (or insecure: true). Returns the server
      # (#port, #stop).
      def listen(address, token: nil, insecure: false, mode: :cpu, interval: nil, err: $stderr)
        PullServer.new(address, token: token, insecure: insecure,
                                profiler: PullProfiler.new(mode: mode, interval: interval), err: err).start
      end

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # In a forked child (Strobe::ForkHook): the parent's session is not the
      # child's; one with its settings starts CHILD_DELAY seconds later.
      def after_fork
        @lock = Mutex.new
        parent = @current
        @current = nil
        return unless parent&.running?(any_process: true)

        @starter = Thread.new do
          Native.exclude_current_thread
          sleep CHILD_DELAY
          @lock.synchronize { @current ||= new(parent.config).start }
        rescue StandardError => e
          warn_line(parent.config.err, "not profiling this child process: #{e.message}")
        end
        @starter.name = "strobe continuous start"
      end

      # One line on err, control characters shown as "?"; nothing it raises
      # goes further.
      def warn_line(err, message)
        err.write("strobe continuous: #{message.to_s.gsub(/[[:cntrl:]]/, '?')}\n")
      rescue StandardError
        nil
      end

      private

      # The session of this process. A process made by a fork that bypassed
      # Process._fork and ForkHook (fork(2) in C code) finds its parent's
      # session here, and starts its own.
      def current
        after_fork if @current && @current.pid != Process.pid && @current.running?(any_process: true)
        @current
      end

      # Starts session and records it. A start left by an exception
      # (Busy, or one a trap handler raised, such as exit) stops what it
      # had started and records nothing.
      def launch(session)
        started = false
        @current = session.start
        started = true
        session
      ensure
        unless started
          @current = nil if @current.equal?(session)
          session.abandon
        end
      end

      def stop_session
        @starter&.kill # (a child's session not started yet never starts)
        session = @lock.synchronize do
          taken = @current
          @current = nil
          taken
        end
        session&.pid == Process.pid ? session.stop : nil
      end

      # At exit, the running session's last window is sent; a forked
      # child starts its own session. Installed once.
      def install_hooks
        return if @hooked

        @hooked = true
        at_exit { stop }
        ForkHook.in_child { after_fork }
      end
    end

    attr_reader :config

    def initialize(config)
      @config = config
      @pid = Process.pid
      @interval = config.interval
      @governor = Governor.new(config.mode == :object ? nil : config.overhead_target, config.interval,
                               SLOWEST.fetch(config.mode))
      @lock = Mutex.new
      @wake = ConditionVariable.new
      @stopping = false
      @windows = @samples = 0
      @own_cpu = 0.0 # seconds of CPU Strobe's threads used for this session, not yet counted
      @last_cost = nil
      @share = nil
    end

    # Starts sampling, the window thread and the upload thread.
    def start
      @target = Pyroscope.new(@config)
      begin_sampling
      @uploader = Uploader.new(@target, note: method(:note), cpu: method(:add_cpu))
      @cutter = Thread.new { cut_loop }
      @cutter.name = "strobe continuous"
      self
    end

    attr_reader :pid

    def running?(any_process: false)
      (any_process || @pid == Process.pid) && !@stopping && !@cutter.nil?
    end

    # Cuts and sends the last window, within flush_timeout: seconds, and
    # stops. Returns the stats.
    def stop
      deadline = Continuous.now + @config.flush_timeout
      @lock.synchronize do
        @stopping = true
        @wake.broadcast
      end
      @cutter&.join([deadline - Continuous.now, 0].max)
      @cutter&.kill
      @cutter&.join(1)
      finish(deadline)
      stats
    end

    # After a start left half way: what it had started stops, and nothing
    # is sent.
    def abandon
      @stopping = true
      @cutter&.kill
      finish(Continuous.now)
    end

    # {windows:, samples:, uploaded:, dropped:, rejected:, queued:,
    # failures:, bytes:, interval:, overhead:, last_error:}: windows cut
    # (with samples) and the samples in them; windows sent, dropped (the
    # store slow or down), refused by it, waiting now; failed attempts;
    # bytes sent; the interval in force; the cost of the last window as a
    # share of one CPU; the last failure's message. (Read without a lock:
    # it may be called from a trap handler.)
    def stats
      { windows: @windows, samples: @samples, uploaded: @uploader.uploaded, dropped: @uploader.dropped,
        rejected: @uploader.rejected, queued: @uploader.queued, failures: @uploader.failures, bytes: @uploader.bytes,
        interval: @interval, overhead: @share, last_error: @uploader.last_error }
    end

    private

    def begin_sampling
      # (The round this start makes, for abandon should an exception from a
      # trap handler land in Strobe.start once the profile began.)
      @round = Native.round + 1
      started = Strobe.start_own(nil, mode: @config.mode, interval: @interval, raw: true,
                                      metadata: { "service_name" => @config.service_name })
      unless started
        @round = nil
        raise Busy, "another profile is running in this process, or a stopped one waits for Strobe.results"
      end

      @round = Native.round
      @from = Time.now
      @cost = Native.cost.sum
    end

    # Whether the profile running is this session's (the program may have
    # stopped it, and started another).
    def mine?
      Strobe.running? && Native.round == @round
    end

    # Every upload_every seconds, the window is cut and queued, until stop
    # (which cuts the last one). However it ends (someone else stopped the
    # profile, an error, the thread killed), what the session started
    # stops with it.
    def cut_loop
      Native.exclude_current_thread
      loop do
        stopping = @lock.synchronize do
          ends = Continuous.now + @config.upload_every
          while !@stopping && (left = ends - Continuous.now).positive?
            @wake.wait(@lock, left)
          end
          @stopping
        end
        break unless cut(final: stopping)
        break if stopping
      end
    rescue StandardError => e
      note "stopped: #{e.class}: #{e.message}"
    ensure
      unless @stopping
        @stopping = true
        finish(Continuous.now + @config.flush_timeout)
      end
    end

    # The profile this session started stops (its samples since the last
    # window go nowhere), and the uploader sends what waits until deadline.
    def finish(deadline)
      Strobe.results if mine? && Native.stop_round(@round)
      @uploader&.close(deadline)
    end

    # Takes the window sampled so far and queues its profile; returns
    # false when the profile is no longer this session's.
    def cut(final:)
      unless mine?
        note "profiling was stopped by someone else: continuous profiling ends" unless final
        return false
      end

      started = thread_cpu
      till = Time.now
      next_interval = govern(till)
      result = if final
                 Native.stop_round(@round)
                 Strobe.results
               else
                 Strobe.snapshot(reset: true)
               end
      queue(result, @from, till, sample_rate(@interval))
      @from = till
      retime(next_interval) unless final || next_interval == @interval
      add_cpu(thread_cpu - started)
      true
    end

    # Samples every interval from now on, without stopping (Native.retime:
    # nothing can start between a stop and a start).
    def retime(interval)
      why = Native.retime(interval)
      return @interval = interval unless why

      note "the sampling interval stays #{@interval} us: #{why}"
    end
    # The interval for the next window, from what the one ending cost.
    def govern(till)
      now_cost = Native.cost.sum
      cost = (now_cost - @cost) / 1e9 + take_cpu
      @cost = now_cost
      wall = till - @from
      @share = wall.positive? ? cost / wall : nil
      @governor.next_interval(@interval, cost, wall)
    end

    def queue(result, from, till, rate)
      return unless result && result[:samples].to_i.positive? # (an empty window tells the store nothing)

      body = StringIO.new(+"".b)
      Strobe.save(result, body, format: :pprof)
      @windows += 1
      @samples += result[:samples]
      @uploader.push(Uploader::Window.new(body.string, from, till, rate))
    end

    # Samples per second (time modes), or "1/N" allocations.
    def sample_rate(interval)
      @config.mode == :object ? "1/#{interval}" : (1_000_000.0 / interval).round
    end

    def add_cpu(seconds)
      @lock.synchronize { @own_cpu += seconds } if seconds.positive?
    end

    def take_cpu
      @lock.synchronize do
        taken = @own_cpu
        @own_cpu = 0.0
        taken
      end
    end

    def thread_cpu
      Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    end

    def note(message)
      Continuous.warn_line(@config.err, message)
    end
  end
end
