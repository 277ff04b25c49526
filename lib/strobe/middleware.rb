# frozen_string_literal: true

require "cgi"
require "fileutils"
require "stringio"
require_relative "../strobe"
require_relative "notifications"
require_relative "middleware/idle_stop"

module Strobe
  # Rack middleware that profiles the requests of a running application.
  #
  #   use Strobe::Middleware, enabled: true, mode: :wall, path: "tmp/profiles/", save_every: 100
  #
  # Options:
  #   enabled:      true, false (the default), or a proc given the Rack env
  #                 that says whether to profile this request
  #   threads:      :requests (the default): a profile holds the threads
  #                 serving profiled requests, and the threads their code
  #                 starts (Ruby 3.2+), each while its request runs; not
  #                 the server's own threads (idle workers, reactors,
  #                 timers). :all: every thread of the process, for as
  #                 long as requests are profiled. (:trace mode traces
  #                 every thread.)
  #   mode:, interval:, raw:, native:, metadata:, format:
  #                 as for Strobe.start (mode :wall, interval 1000; format
  #                 :json, or an export such as :pprof), except that raw
  #                 samples are kept unless raw: false (not in :trace)
  #   path:         where profiles go: a directory (ending in "/", or one
  #                 that exists) gets one file per save, named
  #                 strobe-MODE-PID-TIME.json (or the format's extension,
  #                 .pb.gz for pprof); anything else is the file itself
  #                 (default "tmp/strobe/")
  #   save_every:   write the profile after every N profiled requests
  #                 (default 100; false: never by count)
  #   save_interval: write it when a profiled request ends this many
  #                 seconds or more after the last save (default 60;
  #                 false: never by time)
  #   save_at_exit: write what was collected when the process exits
  #                 (default true)
  #   on_result:    instead of writing files, hand each saved result (a
  #                 Hash) to this proc, one at a time, on a thread of the
  #                 middleware's own (what it raises is reported once)
  #   permit:       a proc given the env: a request it permits that asks
  #                 with ?strobe=1 is answered with its HTML flamegraph
  #                 instead of the page: the samples of its own thread
  #                 (and on Ruby 3.2+ of the threads its code starts) while
  #                 the application handled it, nothing of other requests
  #                 (profiles are then kept raw: the flamegraph is cut
  #                 from them). Not under a fiber scheduler (Falcon), whose
  #                 requests share threads: there the page is served; nor
  #                 can it tell apart requests an application interleaves
  #                 on one thread with fibers of its own. With
  #                 &strobe_format=json|firefox|speedscope|pprof that
  #                 profile is the answer instead, as a file of that format.
  #   sample_rate:  a fraction in (0, 1]: profile only that share of the
  #                 requests (chosen at random) that enabled: lets through;
  #                 with it, enabled: defaults to true
  #   idle_stop:    seconds without a profiled request after which
  #                 profiling stops (default 1; 0 or false: as the last
  #                 request in flight ends). Meanwhile nothing is sampled
  #                 with threads: :requests, and every thread with :all;
  #                 requests that follow each other closely do not pay
  #                 for starting and stopping it each time
  #   endpoint:     a proc given the env once the application answered,
  #                 that names the request's endpoint (nil: as by default):
  #                 see Middleware.endpoint
  #   notifications: ActiveSupport notifications recorded as markers of
  #                 the threads they happen on while profiled: sets of
  #                 Strobe::Notifications (:sql, :controller, :views,
  #                 :cache, or event names), true for every set; default
  #                 none
  #
  # Requests that overlap (threaded servers) share one profile: it starts
  # with the first and stops idle_stop: seconds after the last ends, unless
  # another has begun by then. The profile covers the
  # application's call, not the streaming of the body afterwards. Every
  # save_every profiled requests it is saved, whether or not others are
  # still running: then the profile so far is written and profiling goes
  # on afresh from that instant, so consecutive files hold every sample
  # once. A ?strobe=1 request takes part in that shared profile (its
  # samples are in the next file too, if it was enabled) and takes nothing
  # out of it.
  #
  # A middleware that profiles always saves somewhere: by default in
  # tmp/strobe/, every 100 requests or 60 s, and at exit. One whose saving
  # is all turned off (and with no on_result) says so once, on stderr, as it
  # is built: its profile then grows until #save is called.
  #
  # Between requests the profile is only lent: a Strobe.start from anyone
  # else (Strobe.run, another middleware, the pull endpoint) has this
  # middleware save it (give_way) and step aside, until that profile has
  # stopped; while a profiled request is in flight, that start is refused.
  #
  # Profiling never breaks a request: when Strobe cannot start (another
  # profile is running, the signal is taken), or saving fails, the request
  # is served as if there were no middleware and one line goes to stderr
  # (once per distinct problem). Bad options raise ArgumentError when the
  # middleware is built.
  class Middleware
    OPTIONS = %i[enabled threads mode interval raw native metadata format path save_every save_interval
                 save_at_exit on_result permit notifications sample_rate idle_stop endpoint].freeze
    THREADS = %i[requests all].freeze
    # Threads a request starts inherit its scope by Fiber storage (3.2+).
    FIBER_STORAGE = Fiber.respond_to?(:[])
    DEFAULT_PATH = "tmp/strobe/"
    DEFAULT_SAVE_EVERY = 100   # requests
    DEFAULT_SAVE_INTERVAL = 60 # seconds
    DEFAULT_IDLE_STOP = 1      # second

    FLAMEGRAPH_PARAM = /(?:\A|&)strobe=1(?:&|\z)/
    FORMAT_PARAM = /(?:\A|&)strobe_format=([^&]*)/
    # What ?strobe=1&strobe_format=NAME answers with, beside the flamegraph:
    # the export's content type.
    REQUEST_FORMATS = { "json" => "application/json", "firefox" => "application/json",
                        "speedscope" => "application/json", "pprof" => "application/octet-stream" }.freeze

    def initialize(app, **options)
      unknown = options.keys - OPTIONS
      raise ArgumentError, "unknown option#{'s' if unknown.size > 1}: #{unknown.map(&:inspect).join(', ')}" unless unknown.empty?

      @app = app
      @sample_rate = options[:sample_rate]
      unless @sample_rate.nil? || (@sample_rate.is_a?(Numeric) && @sample_rate.real? && @sample_rate.positive? && @sample_rate <= 1)
        raise ArgumentError, "sample_rate must be a fraction above 0 and at most 1, got #{@sample_rate.inspect}"
      end

      @enabled = check_switch(:enabled, options.fetch(:enabled, !@sample_rate.nil?))
      @permit = check_proc(:permit, options[:permit])
      @endpoint = check_proc(:endpoint, options[:endpoint])
      @on_result = check_proc(:on_result, options[:on_result])
      # Raw samples by default (not in :trace, which has none): the files
      # then make flamegraphs, timelines and every export.
      raw = options.fetch(:raw) { options.fetch(:mode, :wall).to_s == "trace" ? nil : true }
      @profile = { mode: options.fetch(:mode, :wall), interval: options[:interval], raw: raw,
                   native: options[:native], metadata: options.fetch(:metadata, {}), format: options[:format] }.compact
      checked = Options.new(@profile) # every problem with them, now rather than per request
      @format = checked.format
      @threads = options.fetch(:threads, :requests)
      raise ArgumentError, "threads must be :requests or :all, got #{@threads.inspect}" unless THREADS.include?(@threads)

      @threads = :all if checked.trace?
      @profile = @profile.except(:format).merge(raw: checked.raw || !@permit.nil?)
      @path = options.fetch(:path, DEFAULT_PATH)
      raise ArgumentError, "path must be a String, got #{@path.inspect}" unless @path.is_a?(String) && !@path.empty?

      @save_every = check_schedule(:save_every, options.fetch(:save_every, DEFAULT_SAVE_EVERY), Integer, "Integer")
      @save_interval = check_schedule(:save_interval, options.fetch(:save_interval, DEFAULT_SAVE_INTERVAL),
                                      Numeric, "number of seconds")
      save_at_exit = check_switch(:save_at_exit, options.fetch(:save_at_exit, true))
      @idle_stop = options.fetch(:idle_stop, DEFAULT_IDLE_STOP)
      unless [false, nil].include?(@idle_stop) || (@idle_stop.is_a?(Numeric) && @idle_stop.real? && @idle_stop >= 0)
        raise ArgumentError, "idle_stop must be a number of seconds or false, got #{@idle_stop.inspect}"
      end
      @idle_stop = nil if !@idle_stop || @idle_stop.zero?
      sets = options[:notifications]
      Notifications.events_of(Array(sets)) if sets # checked even where nothing is profiled
      @notifications = sets && (@enabled || @permit) ? Notifications.subscribe(*Array(sets)) : nil

      fresh_state
      @warned = {}
      return unless @enabled

      at_exit { save } if save_at_exit
      return if @save_every || @save_interval || save_at_exit || @on_result

      warn_once "save_every:, save_interval: and save_at_exit: are all off: the profile is saved only when #save is called"
    end

    def call(env)
      return flamegraph_response(env) if flamegraph_requested?(env)
      return @app.call(env) unless enabled?(env)

      started = begin_profiling
      begin
        scope = enter_scope if started
        since = Native.now_us if started
        response = @app.call(env)
      ensure
        finish_request(env, since, response, scope, started)
      end
    end

    # What a request is in reports (the request marker's endpoint, pprof's
    # endpoint label), never a text the client chose: the name naming (the
    # endpoint: option, a proc given the env) gives it, if any; else the
    # framework's route: Rails' Controller#action, or its route pattern
    # (Rails 7.1+, a route to a Rack app), Sinatra's "METHOD /pattern",
    # Grape's route; else "METHOD /" for the root path, "METHOD (not
    # found)" for a 404 and "METHOD (unrouted)" for the rest (Roda and
    # Hanami keep no route in the env: name theirs with endpoint:). A
    # method other than the standard ones is OTHER. Cut to ENDPOINT_LIMIT
    # characters; past max_endpoints distinct ones in the process, each new
    # one is "(other)".
    def self.endpoint(env, status = nil, naming = nil)
      name = naming&.call(env)
      name = route_name(env, status) if name.nil? || name.to_s.empty?
      bounded_endpoint(name.to_s)
    end

    def self.route_name(env, status)
      method = METHODS.include?(env["REQUEST_METHOD"]) ? env["REQUEST_METHOD"] : "OTHER"
      controller = env["action_controller.instance"]
      return rails_action(controller) if controller.respond_to?(:action_name) && controller.class.name

      route = env["action_dispatch.route_uri_pattern"] # Rails 7.1+, for a route to a Rack app
      return "#{method} #{route}" if route.is_a?(String) && !route.empty?

      route = env["sinatra.route"] # "GET /users/:id"
      return route if route.is_a?(String) && !route.empty?

      route = grape_route(env, method)
      return route if route
      return "#{method} (not found)" if status == 404

      ["/", ""].include?(env["PATH_INFO"].to_s) ? "#{method} /" : "#{method} (unrouted)"
    end

    # Rails' Controller#action. An action the controller does not have (a
    # route with a dynamic :action, an action_missing) is the client's
    # word: "(unknown action)".
    def self.rails_action(controller)
      action = controller.action_name.to_s
      actions = controller.class.action_methods if controller.class.respond_to?(:action_methods)
      action = "(unknown action)" if actions.respond_to?(:include?) && !actions.include?(action)
      "#{controller.class.name}##{action}"
    end

    # Grape's route: its method (or method, the request's, checked) and
    # path ("GET /api/users/:id(.:format)").
    def self.grape_route(env, method)
      args = env["grape.routing_args"] || env["rack.routing_args"]
      route = args[:route_info] if args.is_a?(Hash)
      return nil unless route.respond_to?(:path) && route.path.is_a?(String) && !route.path.empty?

      method = route.request_method if route.respond_to?(:request_method) && METHODS.include?(route.request_method)
      "#{method} #{route.path}"
    end

    # The longest an endpoint is (characters), and how many distinct ones a
    # process names (Middleware.max_endpoints=): each label value is a
    # series in a profile store.
    ENDPOINT_LIMIT = 120
    DEFAULT_MAX_ENDPOINTS = 200
    OTHER_ENDPOINT = "(other)"
    @endpoints = {}
    @endpoints_lock = Mutex.new
    @max_endpoints = DEFAULT_MAX_ENDPOINTS

    class << self
      attr_reader :max_endpoints

      # How many distinct endpoints this process names (default 200); a
      # request to any other is "(other)".
      def max_endpoints=(count)
        raise ArgumentError, "max_endpoints must be a positive Integer, got #{count.inspect}" unless count.is_a?(Integer) && count.positive?

        @max_endpoints = count
      end

      # name, cut to ENDPOINT_LIMIT, if it is one of the first
      # max_endpoints this process named; else OTHER_ENDPOINT.
      def bounded_endpoint(name)
        name = Markers.utf8(name)
        name = name[0, ENDPOINT_LIMIT] if name.length > ENDPOINT_LIMIT
        @endpoints_lock.synchronize do
          next name if @endpoints.key?(name)
          next OTHER_ENDPOINT if @endpoints.size >= @max_endpoints

          @endpoints[name.frozen? ? name : name.dup.freeze] = true
          name
        end
      end
    end

    # The methods an endpoint names as they are.
    METHODS = %w[GET HEAD POST PUT PATCH DELETE OPTIONS TRACE CONNECT].freeze

    def self.request_path(env)
      path = env["PATH_INFO"].to_s
      path.empty? ? "/" : path
    end

    # Writes the profile collected so far (or hands it to on_result); while
    # requests are profiled, what they have so far, and profiling goes on
    # afresh. Returns the file written, the result handed over, or nil when
    # there is nothing to save.
    def save
      deliver(@lock.synchronize { take_profile })
    end

    # Called by IdleStop at the deadline idle_stop: set: stops this
    # middleware's profile if no request has run since, or sets the
    # deadline again from the last one's end.
    def idle_check
      @lock.synchronize do
        @armed = false
        next unless @active.zero? && @idle_since && running_mine?

        due = @idle_since + @idle_stop
        due > now_s ? arm(due) : stop_round
      end
    rescue StandardError => e
      warn_once "profiling failed: #{e.message}"
    end

    # Someone else wants to start profiling (Strobe.start, another
    # middleware, the pull endpoint...; see Strobe.lend): if no request of
    # this one is in flight, its profile (running on, or stopped and not
    # yet saved) is saved now, in the caller's thread, and the profiler is
    # free; otherwise nothing changes, false is returned and their start is
    # refused (even if the profile was stopped: it holds requests). Called
    # with another middleware's lock held, maybe: nothing here takes
    # another's. Nothing in a trap handler (the signal toggle), where Ruby
    # takes no lock, nor from this middleware's own start.
    def give_way
      return nil if @lock.owned?

      begin
        @lock.lock
      rescue ThreadError
        return nil # in trap context
      end
      begin
        return false unless @active.zero?

        result = take_profile
      ensure
        @lock.unlock
      end
      deliver(result)
    end

    # Takes what the profile holds (the caller holds @lock): after the last
    # request, its result; during requests, a cut of it; nil when there is
    # nothing, or the profile is someone else's (started since).
    private def take_profile
      stop_round if @active.zero? # running on after the last request: taken whole
      @since_save = 0
      @saved_at = now_s
      return nil unless @mine == Native.round
      return Strobe.results unless Strobe.running?

      @active.positive? ? Strobe.snapshot(reset: true) : nil
    end

    private

    def check_switch(name, value)
      return value if [true, false].include?(value) || (name == :enabled && value.respond_to?(:call))

      raise ArgumentError, "#{name} must be true or false#{' (or a proc of the env)' if name == :enabled}, got #{value.inspect}"
    end

    # A saving schedule: a positive number of its kind, or false/nil (off).
    def check_schedule(name, value, kind, kind_name)
      return nil if value.nil? || value == false
      return value if value.is_a?(kind) && value.positive?

      raise ArgumentError, "#{name} must be a positive #{kind_name} or false, got #{value.inspect}"
    end

    def check_proc(name, value)
      return value if value.nil? || value.respond_to?(:call)

      raise ArgumentError, "#{name} must be a proc, got #{value.inspect}"
    end

    def enabled?(env)
      on = @enabled.respond_to?(:call) ? @enabled.call(env) : @enabled
      on && (@sample_rate.nil? || rand < @sample_rate)
    end

    def flamegraph_requested?(env)
      @permit && env["QUERY_STRING"].to_s.match?(FLAMEGRAPH_PARAM) && @permit.call(env)
    end

    # Writes result (or hands it to on_result). Returns the file written,
    # the result handed over, or nil.
    def deliver(result)
      return nil unless result
      return hand_over(result) if @on_result

      target = target_path(result)
      FileUtils.mkdir_p(File.dirname(target))
      Strobe.save(result, target, format: @format)
    rescue StandardError => e
      # Said once per reason and place: the message of a failed save names
      # its temporary file, a new one each time.
      reason = if e.is_a?(AtomicFile::TargetError) then e.reason
               elsif e.is_a?(SystemCallError) then e.class.new.message
               else e.message.lines.first.to_s.chomp
               end
      warn_once "could not save the profile in #{File.dirname(target || @path)}: #{reason}"
      nil
    end

    # on_result gets the results one at a time, in order, on a thread of the
    # middleware's own (started again in a forked child); an error it
    # raises is reported once per kind.
    def hand_over(result)
      @handoff = start_handoff unless @handoff_pid == Process.pid
      @handoff << result
      result
    end

    def start_handoff
      @handoff_pid = Process.pid
      queue = Queue.new
      worker = Thread.new do
        while (result = queue.pop)
          begin
            @on_result.call(result)
          rescue StandardError => e
            warn_once "on_result raised #{e.class}: #{e.message.lines.first.to_s.chomp}"
          end
        end
      end
      worker.name = "strobe on_result"
      queue
    end

    # The first of overlapping requests starts profiling. Returns whether
    # this request takes part in a profile (and must end it).
    def begin_profiling
      fresh_state unless @pid == Process.pid
      @lock.synchronize do
        if @active.zero? && !running_mine?
          # threads: :requests: the first request's thread, then each
          # request's own as it enters its scope.
          threads = @threads == :all ? :all : [Thread.current]
          IdleStop.prepare if @idle_stop
          # (Another middleware's profile between its requests gives way.)
          # (Nor does it add to a profile someone else stopped: those
          # samples are theirs to take with Strobe.results.)
          unless Strobe.start_own(@mine, **@profile, threads: threads)
            warn_once "another profile is running, or a stopped one waits for Strobe.results: " \
                      "requests are served without profiling"
            return false
          end
          @round = @mine = Native.round
          @armed = false # (a deadline of an earlier round may have been replaced)
          Strobe.lend(self, @round)
        end
        @active += 1
      end
      true
    rescue StandardError => e
      warn_once "not profiling: #{e.message}"
      false
    end

    # What a middleware knows of its profile, as it is built, and again in
    # a process forked from the one it was built or last served in (a Puma
    # worker, one forked by fork_worker while serving): there the requests
    # in flight and those counted are the parent's, and no profile runs
    # (the child's copy of one is dropped, see sampler.c).
    def fresh_state
      @lock = Mutex.new
      @pid = Process.pid
      @active = 0     # requests in the shared profile now
      @since_save = 0 # enabled requests profiled since the last save
      @saved_at = now_s
      @round = nil    # Native.round of the profile this middleware runs
      @mine = nil     # ... and of the latest it started, stopped or not
      @idle_since = nil
      @armed = false  # IdleStop will call idle_check
    end

    # With @lock held: whether the profile running is the one this
    # middleware started (someone may have stopped it and started another).
    def running_mine?
      !@round.nil? && Native.round == @round && Strobe.running?
    end

    # With @lock held, as the last request in flight ends: profiling stops
    # now, or idle_stop: seconds later if no request has begun by then.
    def idle
      return stop_round unless @idle_stop

      @idle_since = now_s
      arm(@idle_since + @idle_stop) unless @armed
    end

    def arm(due)
      @armed = true
      IdleStop.arm(self, due)
    end

    # With @lock held: stops this middleware's profile, if it runs. One that
    # holds no counted request (only ?strobe=1 ones of a middleware not
    # enabled for them) is dropped.
    def stop_round
      stopped = @round && Native.stop_round(@round)
      @round = nil
      @armed = false # another middleware's deadline may replace this one's
      Strobe.results if stopped && @since_save.zero?
    end

    # threads: :requests: this thread, and those it starts, are sampled
    # from now on for this request. Returns what leave_scope needs.
    def enter_scope
      return nil if @threads == :all

      id = Native.scope_enter or return nil
      previous = Fiber[Native::SCOPE_KEY] if FIBER_STORAGE
      Fiber[Native::SCOPE_KEY] = id if FIBER_STORAGE
      [id, previous]
    rescue StandardError => e
      warn_once "not profiling this request's threads: #{e.message}"
      nil
    end

    # Each step runs even when the one before is cut short (an exception
    # raised into the thread: a request timeout), so the profile always
    # ends as it began.
    def finish_request(env, since, response, scope, started)
      mark_request(env, since, response) if since
    ensure
      begin
        leave_scope(scope) if scope
      ensure
        end_profiling(counted: true) if started
      end
    end

    # The request on its thread's timeline (result[:markers]), from the
    # application's call to its return: method, path, status (nil when the
    # application raised) and endpoint.
    def mark_request(env, since, response)
      Middleware.mark_request(env, since, response, @endpoint)
    rescue StandardError => e
      warn_once "could not mark the request: #{e.message}"
    end

    # Adds the request marker of env's request, from since (Native.now_us)
    # to now, to its thread's timeline (kept while the thread is sampled,
    # whoever started the profile: Strobe::Continuous::Endpoints uses it);
    # naming: the endpoint: option (see Middleware.endpoint).
    def self.mark_request(env, since, response, naming = nil)
      method = env["REQUEST_METHOD"].to_s
      path = request_path(env)
      status = response.is_a?(Array) ? response[0].to_i : nil
      status = nil unless status&.between?(0, 999)
      # Plain already but for the Strings' encodings (Markers.add's work,
      # without its generic pass over the data).
      method = Markers.utf8(method)
      path = Markers.utf8(path)
      data = { method: method, path: path, status: status, endpoint: endpoint(env, status, naming) }
      Native.marker_add(:request, "#{method} #{path}", since, Native.now_us, data)
    end

    def leave_scope((id, previous))
      Native.scope_leave(id)
      Fiber[Native::SCOPE_KEY] = previous if FIBER_STORAGE
    end

    # The last of overlapping requests stops profiling (idle_stop: seconds
    # later). Every save_every counted requests the profile is taken (a cut
    # of it while others run) and saved.
    def end_profiling(counted:)
      result = @lock.synchronize do
        @active -= 1
        @since_save += 1 if counted
        idle if @active.zero?
        take_profile if save_due?
      end
      deliver(result)
    rescue StandardError => e
      warn_once "profiling failed: #{e.message}"
    end

    # A request answered with its flamegraph: it takes part in the shared
    # profile like any other, and its flamegraph is cut from a snapshot of
    # it: its thread's samples while the application handled it.
    def flamegraph_response(env)
      format = env["QUERY_STRING"].to_s[FORMAT_PARAM, 1]
      if format && !REQUEST_FORMATS.key?(format)
        return [400, { "content-type" => "text/plain; charset=utf-8", "cache-control" => "no-store" },
                ["strobe_format must be one of #{REQUEST_FORMATS.keys.join(', ')}\n"]]
      end
      if Fiber.scheduler
        # Falcon and other fiber servers run many requests on a thread: its
        # samples would show theirs too.
        warn_once "cannot profile one request on a fiber scheduler (other requests share its thread)"
        return @app.call(env)
      end
      counted = enabled?(env) # (before: a proc that raises must not leave profiling on)
      unless begin_profiling
        warn_once "cannot profile this request: another profile is running"
        return @app.call(env)
      end
      threads = [Thread.current.native_thread_id]
      from = Native.now_us
      begin
        scope = enter_scope
        response = @app.call(env)
        to = Native.now_us
        mark_request(env, from, response)
        threads.concat(Native.scope_threads(scope[0])) if scope # those its code started
        snapshot = Strobe.snapshot
      ensure
        leave_scope(scope) if scope
        end_profiling(counted: counted)
      end
      response[2].close if response[2].respond_to?(:close)
      title = "#{env['REQUEST_METHOD']} #{env['PATH_INFO']} (Strobe)"
      result = request_samples(snapshot, threads, from, to)
      return export_response(result, format) if result && format

      [200, { "content-type" => "text/html; charset=utf-8", "cache-control" => "no-store" },
       [flamegraph_page(result, title)]]
    end

    # The request's profile as a file of format (REQUEST_FORMATS), to save.
    def export_response(result, format)
      body = StringIO.new(+"".b)
      Strobe.save(result, body, format: format.to_sym)
      name = File.basename(ProfileFile.path_in("", result, format.to_sym))
      [200, { "content-type" => REQUEST_FORMATS.fetch(format), "cache-control" => "no-store",
              "content-disposition" => "attachment; filename=\"#{name}\"" }, [body.string]]
    end

    # By count or by time, with @lock held; never for a profile holding no
    # counted request.
    def save_due?
      return false if @since_save.zero?

      (@save_every && @since_save >= @save_every) || (@save_interval && now_s - @saved_at >= @save_interval)
    end


    def now_s
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # The samples of the request's threads (its own, then those its code
    # started) from..to, or nil when there are none (or its thread cannot
    # be told apart: Ruby's M:N threads share native ones).
    def request_samples(snapshot, threads, from, to)
      info = snapshot && snapshot[:threads]&.fetch(threads.first, nil)
      return nil unless info && !info[:mn] && Stacks.samples?(snapshot)

      result = Native.windows_subset(snapshot, threads.uniq.map { |thread| [thread, from, to] })
      sampled = result[:stacks].is_a?(Stacks) ? result[:stacks].sampled_thread_ids : result[:raw_sample_threads]
      result[:threads].select! { |id, _| id == threads.first || sampled.include?(id) }
      result[:samples].positive? ? result : nil
    end

    def flamegraph_page(result, title)
      unless result
        interval = @profile[:interval] || Options::DEFAULT_INTERVAL.fetch(@profile[:mode].to_sym, nil)
        interval = interval ? " at #{interval} #{@profile[:mode].to_sym == :object ? 'allocations' : 'µs'}" : ""
        return "<!DOCTYPE html><meta charset=\"utf-8\"><title>#{CGI.escapeHTML(title)}</title>" \
               "<p>No samples of this request were taken (sampling #{@profile[:mode]}#{interval}): it was " \
               "shorter than the interval, or its thread could not be told apart from others (Ruby's M:N " \
               "threads share native threads).</p>"
      end
      html = StringIO.new
      Report.new(result).print_flamegraph(html, title: title)
      html.string
    end

    def target_path(result)
      ProfileFile.directory?(@path) ? ProfileFile.path_in(@path, result, @format) : @path
    end

    # At most this many distinct problems are reported; then one line says
    # so and the rest go unsaid (a server may run for months).
    MAX_WARNINGS = 50

    def warn_once(message)
      return if @warned[message] || @warned.size > MAX_WARNINGS

      @warned[message] = true
      message = "#{MAX_WARNINGS} problems reported; further ones are not" if @warned.size > MAX_WARNINGS
      warn "Strobe::Middleware: #{Report.printable(message)}"
    rescue IOError, SystemCallError
      nil # stderr closed (a daemon): nothing to tell it on
    end
  end
end
