# frozen_string_literal: true

# Slowdown under mode: :trace, Strobe against ruby-prof in the same run:
#
#   fib          fib(25): 242,785 calls of fib, and of Integer#<, #- and #+
#   workload     bench_helper's method-heavy program (Ruby methods about 30
#                deep, hash, string and array work: C methods)
#
# Each case runs untraced, under Strobe (clock: :wall), under ruby-prof
# (RubyProf::Profile with its defaults: wall time, every method), and under
# two null tracers (bench/hook_floor.c, compiled on the fly): hooks on the
# same events that do nothing, and hooks that only read the clock Strobe
# reads. They show the floor no tracer built on Ruby's event hooks can go
# under on this machine. The untraced runs come first (once a hook has been
# on, Ruby runs the methods it rewrote for it slower); the four traced
# configurations then run in turn, BENCH_REPS [11] rounds, so the
# machine's drift touches them alike. Slowdown = median(traced time) /
# median(untraced time); budget: Strobe's slowdown at most a quarter of
# ruby-prof's.
#
#   ruby -Ilib bench/trace.rb
#
# Needs the ruby-prof gem (`gem install ruby-prof -v 1.4.5`, as Debian's
# ruby-prof); BENCH_REPS [11], BENCH_FIB [25], BENCH_UNITS [workload units, 3000].

require_relative "bench_helper"
require "ruby-prof"
require "tmpdir"
require "fileutils"
require "open3"

module TraceBench
  REPS = Bench.env_int("BENCH_REPS", 11)
  FIB = Bench.env_int("BENCH_FIB", 25)
  UNITS = Bench.env_int("BENCH_UNITS", 3000)
  BUDGET = 0.25

  module_function

  def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)

  # bench/hook_floor.c built as an extension in a temporary directory.
  def load_floor
    dir = Dir.mktmpdir("strobe-hook-floor")
    File.write(File.join(dir, "extconf.rb"), %(require "mkmf"\ncreate_makefile("hook_floor")\n))
    FileUtils.cp(File.expand_path("hook_floor.c", __dir__), dir)
    out, status = Open3.capture2e(RbConfig.ruby, "extconf.rb", chdir: dir)
    out2, status2 = Open3.capture2e("make", "-s", chdir: dir) if status.success?
    abort "could not build bench/hook_floor.c:\n#{out}#{out2}" unless status.success? && status2&.success?
    require File.join(dir, "hook_floor")
  end

  # The untraced runs first, while no hook has ever been on (Ruby leaves
  # the methods it rewrote for tracing slower afterwards); then the four
  # traced configurations in turn, one run of each per round, so that the
  # machine's drift touches them alike. Medians of REPS runs.
  def run_case(name, work)
    work.call # warm up
    base = Bench.median(Array.new(REPS) { Bench.time { work.call } })
    configs = {
      strobe: -> { Strobe.run(mode: :trace) { work.call } },
      ruby_prof: -> { RubyProf::Profile.profile { work.call } },
      empty: -> { HookFloor.empty_on; begin; work.call; ensure; HookFloor.off; end },
      clock: -> { HookFloor.clock_on; begin; work.call; ensure; HookFloor.off; end },
    }
    times = configs.transform_values { [] }
    REPS.times { configs.each { |key, run| times[key] << Bench.time { run.call } } }
    [name, base, *times.values_at(:strobe, :ruby_prof, :empty, :clock).map { |list| Bench.median(list) }]
  end

  def run
    load_floor
    Bench.header("Slowdown under exact tracing, median of #{REPS} (ruby-prof #{RubyProf::VERSION})")
    workload = Bench::Workload.new(depth: 30)
    rows = [
      run_case("fib(#{FIB})", -> { fib(FIB) }),
      run_case("workload", -> { workload.run(UNITS) }),
    ]
    Bench.table(%w[case untraced\ ms Strobe ruby-prof ratio empty\ hooks hooks+clock],
                rows.map do |name, base, strobe, rp, empty, clock|
                  [name, format("%.1f", base * 1000), format("%.1fx", strobe / base), format("%.1fx", rp / base),
                   Bench.ratio(strobe / base, rp / base, 2), format("%.1fx", empty / base), format("%.1fx", clock / base)]
                end)
    rows.each do |name, base, strobe, rp, _, clock|
      ratio = (strobe / base) / (rp / base)
      verdict = ratio <= BUDGET ? "within budget" : "OVER budget"
      puts format("%s: Strobe %.1fx, ruby-prof %.1fx, ratio %.2f, budget at most %.2f: %s " \
                  "(null tracer reading the clock: %.1fx)", name, strobe / base, rp / base, ratio, BUDGET, verdict, clock / base)
    end
  end
end

TraceBench.run if $PROGRAM_NAME == __FILE__
