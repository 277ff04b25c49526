# frozen_string_literal: true

require_relative "markers"
require_relative "sql_shape"

module Strobe
  # ActiveSupport notifications as markers (opt-in, per event set): each
  # event that ends on a thread being sampled becomes a marker of that
  # thread, its type the event's name, its span the event's, its data the
  # parts of the payload worth reading in a timeline.
  #
  #   subscription = Strobe::Notifications.subscribe(:sql, :controller)
  #   ...
  #   subscription.unsubscribe
  #
  # Sets: :sql (sql.active_record: name, SQL, cached), :controller
  # (process_action.action_controller: controller, action, method, path,
  # status, format, view and db runtimes), :views (render_template,
  # render_partial and render_collection.action_view: template, layout,
  # count), :cache (cache_read, cache_write and cache_fetch_hit
  # .active_support: key, hit); true for all four. Any other event name
  # (a String such as "deliver.action_mailer") is recorded with the
  # payload's numbers, true and false, Symbols, and the short Strings of
  # keys that name things (SAFE_KEYS), not its other texts (a mail's body,
  # addresses).
  #
  # SQL is recorded in its shape (SQLShape): without bind values, with its
  # string and number literals as ? however the database quotes them (as
  # the payload's :connection adapter's dialect reads it, when it has one),
  # and without comments (adapters that inline values, such as mysql2 and
  # trilogy by default, would otherwise put them in the profile). Long
  # texts are cut at TEXT_LIMIT characters. Subscriptions to an event are
  # shared: two middlewares asking for :sql record each query once.
  module Notifications
    SETS = {
      sql: %w[sql.active_record],
      controller: %w[process_action.action_controller],
      views: %w[render_template.action_view render_partial.action_view render_collection.action_view],
      cache: %w[cache_read.active_support cache_write.active_support cache_fetch_hit.active_support],
    }.freeze
    TEXT_LIMIT = 4000
    # Keys of another event's payload whose short Strings are kept.
    SAFE_KEYS = %i[name class controller action method format mailer action_name job_class queue_name adapter status
                   exception_class].freeze
    SAFE_TEXT_LIMIT = 200

    # Listeners by event name, each with how many subscriptions hold it.
    @listeners = {}
    @lock = Mutex.new

    module_function

    # Subscribes to the events of sets (Symbols of SETS, event names, or
    # true for every set). ArgumentError for an unknown set, or when
    # ActiveSupport::Notifications cannot be loaded.
    def subscribe(*sets)
      events = events_of(sets)
      begin
        require "active_support/notifications"
      rescue LoadError
        raise ArgumentError, "notifications need ActiveSupport::Notifications (the activesupport gem), which is not installed"
      end
      events.each { |event| hold(event) }
      Subscription.new(events)
    end

    # One ActiveSupport subscription per event, however many ask for it.
    def hold(event)
      @lock.synchronize do
        entry = (@listeners[event] ||= [ActiveSupport::Notifications.subscribe(event, Listener.new(event)), 0])
        entry[1] += 1
      end
    end

    def release(event)
      @lock.synchronize do
        entry = @listeners[event] or return
        next unless (entry[1] -= 1).zero?

        ActiveSupport::Notifications.unsubscribe(entry[0])
        @listeners.delete(event)
      end
    end

    # The event names sets stand for; ArgumentError naming what is unknown.
    def events_of(sets)
      sets = sets.flatten
      sets = SETS.keys if sets == [true]
      raise ArgumentError, "notifications: name at least one event set (#{SETS.keys.map(&:inspect).join(', ')})" if sets.empty?

      sets.flat_map do |set|
        next SETS.fetch(set) { raise ArgumentError, "unknown notifications set: #{set.inspect} (#{SETS.keys.map(&:inspect).join(', ')})" } if set.is_a?(Symbol)
        next [set] if set.is_a?(String) && !set.empty?

        raise ArgumentError, "notifications: a set is a Symbol (#{SETS.keys.map(&:inspect).join(', ')}) or an event name, got #{set.inspect}"
      end.uniq
    end

    # What a subscription to sets holds, to end it.
    class Subscription
      def initialize(events)
        @events = events
      end

      def unsubscribe
        @events.each { |event| Notifications.release(event) }
        @events = []
        nil
      end
    end

    # An evented subscriber: start and finish run on the thread (and fiber)
    # of the event, nested events in order, so the starts wait on a stack of
    # that fiber's.
    class Listener
      # Starts a fiber keeps waiting at most (an event whose finish never
      # comes: another subscriber's start raised, which ends the event).
      MAX_OPEN = 256

      def initialize(event)
        @event = event
        @type = Markers.type_of(event)
        @key = :"__strobe_#{event}"
      end

      def start(_name, _id, _payload)
        starts = (Thread.current[@key] ||= [])
        starts.shift if starts.size >= MAX_OPEN
        starts << Native.now_us
      end

      def finish(_name, _id, payload)
        started = Thread.current[@key]&.pop
        return unless started && Native.sampling_current_thread?

        name, data = Notifications.describe(@event, payload.is_a?(Hash) ? payload : {})
        Markers.add(@type, name, started, Native.now_us, data)
      rescue StandardError
        nil # a marker is never worth breaking the application's event
      end

      def publish_event(_event) = nil
      def publish(*) = nil
    end

    # An event's marker name and data, from its payload.
    def describe(event, payload)
      case event
      when "sql.active_record"
        sql = text(sql_shape(payload[:sql], connection: payload[:connection]))
        [text(payload[:name] || "SQL"), { sql: sql, cached: payload[:cached] ? true : nil }.compact]
      when "process_action.action_controller"
        data = payload.slice(:controller, :action, :method, :path, :status, :format, :view_runtime, :db_runtime)
        ["#{payload[:controller]}##{payload[:action]}", plain(data)]
      when /\Arender_(template|partial|collection)\.action_view\z/
        identifier = text(payload[:identifier])
        [File.basename(identifier.to_s), plain({ identifier: identifier, layout: payload[:layout], count: payload[:count],
                                                 cache_hits: payload[:cache_hits] })]
      when /\Acache_(read|write|fetch_hit)\.active_support\z/
        key = text(payload[:key].is_a?(Array) ? payload[:key].join("/") : payload[:key])
        ["#{Regexp.last_match(1)} #{key}", plain({ key: key, hit: payload[:hit], super_operation: payload[:super_operation] })]
      else
        [event, plain(payload, strings: SAFE_KEYS)]
      end
    end

    # sql with its literals as ?: its shape, without the values an adapter
    # may have put in it (see SQLShape), read in the dialect of connection
    # (the payload's Active Record adapter), or in every dialect when it
    # does not say.
    def sql_shape(sql, connection: nil)
      sql.nil? ? nil : SQLShape.shape(sql, dialect: dialect_of(connection))
    end

    def dialect_of(connection)
      SQLShape.dialect(connection.adapter_name) if connection.respond_to?(:adapter_name)
    rescue StandardError
      nil
    end

    # The payload's values a marker can hold as they are: numbers, true,
    # false, Symbols (as Strings), and Strings (cut to TEXT_LIMIT), or with
    # strings: only those of those keys, at most SAFE_TEXT_LIMIT long.
    def plain(payload, strings: nil)
      payload.each_with_object({}) do |(key, value), data|
        key = key.to_sym
        value = case value
                when Symbol then text(value)
                when String then text(value) if strings.nil? || (strings.include?(key) && value.length <= SAFE_TEXT_LIMIT)
                when Integer, Float, true, false then value
                end
        data[key] = value unless value.nil?
      end
    end

    def text(value)
      return nil if value.nil?

      str = value.to_s
      str.length > TEXT_LIMIT ? "#{str[0, TEXT_LIMIT]}…" : str
    end
  end
end
