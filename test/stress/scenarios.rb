# frozen_string_literal: true

# The stress scenarios: programs that do what crashed or hung other Ruby
# profilers (signal handlers, GC compaction, fork, VM shutdown, YJIT,
# signal conflicts, Ractors) while Strobe samples at 10 kHz. Each runs in a
# child process after PRELUDE, with STRESS_OUT naming the profile file it
# must leave. A scenario is {code:, status: (expected exit status, 0),
# profile: (whether a profile must be left, true), ruby_args: ([]),
# stderr: (a Regexp stderr must match, or nil), unless_ruby_crashes: (a
# program run without Strobe first: the scenario is skipped where this Ruby
# does not survive it), since_ruby: and why: (for a crash of older Rubies
# too rare to catch in one plain run: skipped before that version, saying
# why)}.
module StressScenarios
  PRELUDE = <<~'RUBY'
    require "strobe"
    OUT = ENV.fetch("STRESS_OUT")
    $stdout.sync = true
    def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
    # Method calls, allocations and a little of everything, for seconds.
    def churn(seconds)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      kept = []
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        fib(12)
        kept << Array.new(50) { |i| "s#{i}" }.map(&:upcase).join
        kept.shift if kept.size > 200
      end
      kept.size
    end
    def save! = Strobe.results(OUT)
  RUBY

  TIME_MODES = %i[wall cpu].freeze

  # 15 machine-stack overflows in C (Marshal.dump of a 200,000-deep Array),
  # each rescued, on two threads: what the stack_overflow scenarios run
  # while profiling, and without Strobe first, to see whether this Ruby
  # survives them at all.
  OVERFLOWS = <<~'RUBY'
    deep = []
    at = deep
    200_000.times { inner = []; at << inner; at = inner }
    overflow = lambda do
      Marshal.dump(deep)
      :no_overflow
    rescue SystemStackError
      Strobe.sample if defined?(Strobe) && Strobe.running?
      :rescued
    end
    thread = Thread.new { Array.new(5) { overflow.call } }
    outcomes = Array.new(10) { overflow.call } + thread.value
    raise "outcomes: #{outcomes.tally}" unless outcomes.all?(:rescued)
  RUBY

  def self.each_mode(name, &block)
    TIME_MODES.to_h { |mode| ["#{name}_#{mode}", block.call(mode)] }
  end

  SCENARIOS = {}.merge(
    each_mode("gc_compact_loop") do |mode|
      { code: <<~RUBY }
        Strobe.start(mode: :#{mode}, interval: 100, raw: true)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5
        while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          churn(0.01)
          GC.compact
        end
        Strobe.stop
        save!
      RUBY
    end,
    each_mode("auto_compact") do |mode|
      { code: <<~RUBY }
        GC.start # Ruby 3.1.2: never turn auto-compaction on mid-GC (see test/test_helper.rb)
        GC.auto_compact = true
        Strobe.start(mode: :#{mode}, interval: 100, raw: true)
        20.times { churn(0.02); GC.start }
        Strobe.stop
        save!
      RUBY
    end,
    each_mode("gc_stress_bursts") do |mode|
      { code: <<~RUBY }
        Strobe.start(mode: :#{mode}, interval: 100, raw: true)
        5.times do
          churn(0.05)
          GC.stress = true
          200.times { |i| [i.to_s, { i => i }] }
          GC.stress = false
        end
        Strobe.stop
        save!
      RUBY
    end,
    each_mode("fork_children") do |mode|
      { code: <<~RUBY }
        Strobe.start(mode: :#{mode}, interval: 100, raw: true)
        churn(0.1)
        plain = fork do
          churn(0.1)
          raise "child still profiling" if Strobe.running?
          Strobe.run(mode: :#{mode}, interval: 100) { churn(0.1) }
          exit!(0)
        end
        execed = fork { exec(RbConfig.ruby, "-e", "exit 7") }
        churn(0.1)
        Process.wait(plain)
        raise "fork child: \#{$?.inspect}" unless $?.exitstatus == 0
        Process.wait(execed)
        raise "exec child: \#{$?.inspect}" unless $?.exitstatus == 7
        Strobe.stop
        save!
      RUBY
    end,
    each_mode("signal_free_scheduler") do |mode|
      { code: <<~RUBY }
        trap(Strobe::Native::SIGNAL) {} # the program owns the signal: no matter without signals
        Strobe.start(mode: :#{mode}, interval: 100, scheduler: :thread, raw: true)
        workers = 4.times.map { |i| Thread.new { i.even? ? churn(0.3) : sleep(0.3) } }
        churn(0.1)
        GC.compact
        churn(0.1)
        workers.each(&:join)
        Strobe.stop
        raise "signals were sent" unless Strobe::Native.thread_registry[:signals].zero?
        save!
      RUBY
    end,
    each_mode("native_frames") do |mode|
      # native: true: libunwind walks in the handler while threads start
      # and end (cold, then set up), fibers switch, GC compacts, C code
      # runs without the GVL, children fork, and exceptions unwind.
      { code: <<~RUBY }
        require "zlib"
        early = Thread.new { churn(0.8) }
        Strobe.start(mode: :#{mode}, interval: 100, raw: true, native: true)
        data = Random.new(1).bytes(1 << 16)
        workers = 3.times.map { Thread.new { 20.times { Zlib.deflate(data); churn(0.005) } } }
        fiber = Enumerator.new { |y| loop { y << Zlib.crc32(data); churn(0.002) } }
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.6
        while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          fiber.next
          Thread.new { Zlib.deflate(data) }.join
          begin
            Integer("x")
          rescue ArgumentError
          end
          GC.compact if rand < 0.05
        end
        # The sanitizer run's allocator (GCC 12's AddressSanitizer) is not
        # held across fork as glibc's malloc is: a worker in Zlib's malloc
        # without the GVL at that instant left the child waiting forever
        # for the allocator's lock. There the workers finish first.
        workers.each(&:join) if ENV.fetch("LD_PRELOAD", "").include?("libasan")
        pid = fork { churn(0.05); exit!(0) }
        Process.wait(pid)
        raise "child failed" unless $?.success?
        (workers << early).each(&:join)
        Strobe.stop
        result = Strobe.results
        raise "no native frames" if result[:frames].values.none? { |f| f[:native] }
        Strobe::ProfileFile.write(result, OUT)
      RUBY
    end,
    # SystemStackError rescued over and over, on two threads, while
    # sampled: the handler runs on the alternate signal stack (it crashed
    # on the thread's own), and the threads are still sampled afterwards,
    # in a new profile too. Skipped where Ruby itself crashes on the
    # program (3.3 and 3.4: "[BUG] system stack overflow during GC").
    [%w[wall], %w[cpu], %w[object], %w[custom], %w[wall native], %w[cpu native]].to_h do |mode, native|
      options = "mode: :#{mode}, interval: #{mode == 'object' ? 10 : 100}, raw: true"
      options += ", native: Strobe::Native::NATIVE_FRAMES" if native
      timed = %w[wall cpu].include?(mode)
      ["stack_overflow_#{mode}#{'_native' if native}", { unless_ruby_crashes: OVERFLOWS, code: <<~RUBY }]
        Strobe.start(#{options})
        #{OVERFLOWS}
        churn(0.1)
        Strobe.sample if #{mode == 'custom'}
        Strobe.stop
        save!
        if #{timed}
          later = Strobe.run(mode: :#{mode}, interval: 1000) { churn(0.2) }
          raise "not sampled after the overflows" unless later[:samples] > 0
        end
      RUBY
    end,
    "daemon" => { code: <<~RUBY },
      Strobe.start(mode: :wall, interval: 100, raw: true)
      churn(0.05)
      marker = OUT + ".daemon"
      pid = fork do
        Process.daemon(true, true)
        Strobe.run(mode: :wall, interval: 100, raw: true, out: marker + ".tmp") { churn(0.1) }
        File.rename(marker + ".tmp", marker)
      end
      Process.wait(pid)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      sleep 0.02 until File.exist?(marker) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      raise "the daemon left no profile" unless Strobe.load(marker)[:samples] > 0
      Strobe.stop
      save!
    RUBY
    "exit_while_profiling" => { status: 3, code: <<~RUBY },
      at_exit { Strobe.stop; save! }
      Strobe.start(mode: :wall, interval: 100, raw: true)
      Thread.new { churn(1) }
      churn(0.2)
      exit 3
    RUBY
    "exit_bang_while_profiling" => { status: 4, profile: false, code: <<~RUBY },
      Strobe.start(mode: :cpu, interval: 100, raw: true)
      Thread.new { churn(1) }
      churn(0.2)
      exit! 4
    RUBY
    "abort_while_profiling" => { status: 1, stderr: /giving up/, code: <<~RUBY },
      at_exit { Strobe.stop; save! }
      Strobe.start(mode: :cpu, interval: 100, raw: true)
      churn(0.2)
      abort "giving up"
    RUBY
    "uncaught_exception_while_profiling" => { status: 1, stderr: /RuntimeError/, code: <<~RUBY },
      at_exit { Strobe.stop; save! }
      Strobe.start(mode: :wall, interval: 100, raw: true)
      churn(0.2)
      raise "unhandled"
    RUBY
    "exit_without_stopping" => { profile: false, code: <<~RUBY },
      Strobe.start(mode: :wall, interval: 100, raw: true)
      4.times { Thread.new { churn(2) } }
      churn(0.2)
    RUBY
    "start_in_at_exit" => { code: <<~RUBY },
      at_exit do
        Strobe.run(mode: :wall, interval: 100, raw: true, out: OUT) { churn(0.2) }
      end
      churn(0.05)
    RUBY
    "thread_churn" => { code: <<~RUBY },
      Strobe.start(mode: :wall, interval: 100, raw: true)
      1000.times.each_slice(50) { |slice| slice.map { |i| Thread.new { fib(8); i } }.each(&:join) }
      Strobe.stop
      save!
      raise "registry kept ended threads" unless Strobe::Native.thread_registry[:live] <= 2
    RUBY
    # Threads starting and ending under the process-wide timer at 100 us:
    # its signal lands on any thread, one still starting on Ruby's 16 KiB
    # alternate stack among them (handlers nested there until it overflowed
    # when they did not block their signal).
    "process_timer_thread_churn" => { code: <<~RUBY },
      %i[wall cpu].each do |mode|
        Strobe.start(mode: mode, interval: 100, timer: :process, raw: true)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5
        while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          8.times.map { |i| Thread.new { fib(10); i } }.each(&:join)
        end
        Strobe.stop
      end
      save!
    RUBY
    # Threads that raise or are killed, which Ruby 3.1 ends without
    # THREAD_END: they must not be read as they free their frames ([BUG]
    # in rb_profile_frames, under the process-wide timer mostly), under
    # either timer.
    "raising_thread_churn" => { code: <<~RUBY },
      [%i[wall process], %i[cpu process], %i[wall threads]].each do |mode, timer|
        Strobe.start(mode: mode, interval: 100, timer: timer, raw: true)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.3
        while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          threads = 8.times.map do |i|
            Thread.new do
              Thread.current.report_on_exception = false
              fib(8)
              raise "ends by raising" if i.odd?
              Thread.current.kill if i % 4 == 2
              i
            end
          end
          threads.each { |t| t.join rescue nil }
        end
        Strobe.stop
      end
      save!
    RUBY
    "deep_recursion" => { code: <<~RUBY },
      def descend(n) = n.zero? ? churn(0.3) : descend(n - 1)
      r = Strobe.run(mode: :cpu, interval: 100, raw: true) { descend(10_000) }
      raise "no truncated samples: \#{r[:truncated_samples].inspect}" unless r[:truncated_samples] > 0
      Strobe.save(r, OUT)
    RUBY
    "yjit" => { ruby_args: ["--yjit"], code: <<~RUBY },
      raise "no YJIT" unless defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?
      sleeper = Thread.new { sleep 0.5 }
      Strobe.start(mode: :cpu, interval: 100, raw: true)
      churn(0.3)
      Strobe.stop
      Strobe.start(mode: :wall, interval: 100, raw: true)
      churn(0.3)
      Strobe.stop
      sleeper.join
      save!
    RUBY
    "foreign_sigprof_and_sigalrm_handlers" => { code: <<~RUBY },
      got = Hash.new(0)
      prof = trap("PROF") { got[:prof] += 1 }
      alrm = trap("ALRM") { got[:alrm] += 1 }
      Strobe.start(mode: :wall, interval: 100, raw: true)
      5.times { Process.kill("PROF", Process.pid); Process.kill("ALRM", Process.pid); churn(0.02) }
      Strobe.stop
      5.times { Process.kill("PROF", Process.pid); Process.kill("ALRM", Process.pid); churn(0.01) }
      raise "handlers ran \#{got}" unless got == { prof: 10, alrm: 10 }
      mine_prof = trap("PROF", "DEFAULT")
      mine_alrm = trap("ALRM", "DEFAULT")
      raise "handlers replaced" unless mine_prof.is_a?(Proc) && mine_alrm.is_a?(Proc)
      save!
    RUBY
    "foreign_sigurg_handler_is_refused" => { code: <<~RUBY },
      got = 0
      trap(Strobe::Native::SIGNAL) { got += 1 }
      begin
        Strobe.start(mode: :wall, interval: 100)
        raise "started over a foreign handler"
      rescue Strobe::Error => e
        raise e unless e.message.include?("already has a handler")
      end
      Process.kill(Strobe::Native::SIGNAL, Process.pid)
      sleep 0.05
      raise "the program's handler is gone" unless got == 1
      trap(Strobe::Native::SIGNAL, "SYSTEM_DEFAULT")
      Strobe.run(mode: :custom, out: OUT) { Strobe.sample }
    RUBY
    "blocking_calls_under_sampling" => { code: <<~RUBY },
      Strobe.start(mode: :wall, interval: 100, raw: true)
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      sleep 0.2
      slept = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
      raise "sleep returned early: \#{slept}" if slept < 0.2
      r, w = IO.pipe
      writer = Thread.new { 20.times { |i| sleep 0.01; w.write("chunk\#{i}\\n") }; w.close }
      lines = r.each_line.map(&:chomp)
      writer.join
      raise "pipe read \#{lines.size} lines" unless lines == Array.new(20) { |i| "chunk\#{i}" }
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      raise "select saw data" unless IO.select([r2 = IO.pipe.first], nil, nil, 0.15).nil?
      raise "select returned early" if Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < 0.15
      q = Queue.new
      Thread.new { sleep 0.05; q << :item }
      raise "queue" unless q.pop == :item
      m = Mutex.new
      cv = ConditionVariable.new
      ready = false
      Thread.new { sleep 0.05; m.synchronize { ready = true; cv.signal } }
      m.synchronize { cv.wait(m, 1) until ready }
      raise "system" unless system(RbConfig.ruby, "-e", "sleep 0.05")
      out = IO.popen([RbConfig.ruby, "-e", "sleep 0.05; print :done"], &:read)
      raise "popen: \#{out.inspect}" unless out == "done"
      Strobe.stop
      save!
    RUBY
    # Ruby 3.1.2 crashes on this program without Strobe, even unloaded
    # ("[BUG] Segmentation fault at 0x0" in GC as a Ractor's thread
    # starts): 6 of 40 runs; 3.3, 3.4 and 4.0: 0 of 25 each.
    "ractors" => { stderr: nil, since_ruby: "3.3",
                   why: "Ractors of Ruby before 3.3 crash on this program without Strobe (6 of 40 runs on 3.1.2)",
                   code: <<~RUBY },
      Warning[:experimental] = false
      %i[wall cpu].each do |mode|
        Strobe.start(mode: mode, interval: 100, raw: true)
        ractors = 2.times.map { Ractor.new { f = ->(n) { n < 2 ? n : f.(n - 1) + f.(n - 2) }; f.(24) } }
        churn(0.2)
        # Ractor#value on 4.0+, where Ractor#take is gone.
        results = ractors.map { |r| r.respond_to?(:value) ? r.value : r.take }
        raise "ractors: \#{results}" unless results == [46_368, 46_368]
        Strobe.stop
      end
      save!
    RUBY
  ).freeze
end
